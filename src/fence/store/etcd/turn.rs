//! A key's turn across replicas in etcd: the decision made on what the
//! replica believes of the key (the mark it saw last, no write in flight but
//! its own idle share) or on a read at one revision, committed by one
//! transaction that compares what it was made on (in a batch, batch.rs),
//! made again when something moved; the wait a raise puts while writes are
//! in flight; and the records a transaction in flight may write.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use super::names::{mark_value, prefix_end, KeyNames, Record};
use super::{lease, unchanged, unexpected, Inner, State, STORE};
use crate::fence::store::knowledge::Before;
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

/// This replica's idle share of a key, taken by a turn that ends it: its
/// record is deleted by the turn's transaction, or queued for deletion when
/// the turn ends without one.
struct Claimed<'a>(Option<String>, &'a Arc<Inner>);

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            self.1.end_record(record);
        }
    }
}

/// What a turn's decision is made on, and the comparisons that keep it true
/// until its transaction commits.
struct Basis {
    mark: Option<u64>,
    /// The token waiting to raise the key.
    wait: Option<u64>,
    /// That the wait is as found, for the turn to put its own.
    wait_unchanged: Compare,
    held: Option<KeyValue>,
    /// The writes in flight, but the share the turn ends.
    records: Vec<Record>,
    /// The deletions counter.
    deletions: u64,
    compares: Vec<Compare>,
    /// Made on what the replica believed, not on a read.
    guessed: bool,
    /// A failed comparison answers the key's state (the reads are in the
    /// transaction).
    answers: bool,
}

/// How a guess that fails weighs against one that holds, in
/// [`Inner::guesses`]: while more than about one guess in [`MISS_WEIGHT`]
/// fails (other replicas raise the keys this one writes), guesses carry the
/// reads that answer a key's state, so a failed one costs no round of its
/// own; otherwise a guess is the smaller transaction (what a raise costs
/// on etcd is mostly its size: decoded, logged and synced).
const MISS_WEIGHT: u32 = 8;

/// The score above which guesses carry the reads; and its ceiling, so a
/// run of misses is forgotten after a few hundred guesses that hold.
const MISSES_READ_ABOVE: u32 = 10 * MISS_WEIGHT;
const MISSES_AT_MOST: u32 = 4 * MISSES_READ_ABOVE;

impl Inner {
    /// What this replica believes of `key` before it reads it: the mark it
    /// saw last (none if it saw none), no wait, no hold, and no write in
    /// flight but its own idle share `claimed`, which the turn ends. A
    /// turn made on it is one etcd round when it holds (a failed comparison
    /// answers the key's state), as it does for keys this replica raises.
    /// None when the mark seen is above `token`: a refusal is made on a read.
    fn guess(&self, before: Before, names: &KeyNames, token: u64, claimed: Option<&str>) -> Option<Basis> {
        let Before { seen, deletions } = before;
        if seen.is_some_and(|m| m > token) {
            return None;
        }
        let flights = names.flights.as_str();
        let end = prefix_end(flights.as_bytes());
        let mut compares = vec![
            match seen {
                Some(m) => Compare::value(names.mark.as_str(), CompareOp::Equal, mark_value(m)),
                None => Compare::version(names.mark.as_str(), CompareOp::Equal, 0),
            },
            Compare::version(names.wait.as_str(), CompareOp::Equal, 0),
            // No hold, and no marks deleted since this replica last counted:
            // compared by the batch (`batched`), once for its turns.
        ];
        // No record of the key in etcd (an empty range passes), but the claimed one.
        match claimed {
            Some(share) => {
                let after = [share.as_bytes(), b"\0"].concat();
                compares.push(Compare::version(flights, CompareOp::Equal, 0).with_range(share));
                compares.push(Compare::version(after, CompareOp::Equal, 0).with_range(end));
            }
            None => compares.push(Compare::version(flights, CompareOp::Equal, 0).with_range(end)),
        }
        let wait_unchanged = Compare::version(names.wait.as_str(), CompareOp::Equal, 0);
        let answers = seen.is_none() || self.guesses_miss();
        let (wait, held, records) = (None, None, Vec::new());
        Some(Basis { mark: seen, wait, wait_unchanged, held, records, deletions, compares, guessed: true, answers })
    }

    /// The basis of a decision on `state`, as etcd answered it: checked
    /// against what this replica knew `before`, and compared unchanged when
    /// the decision commits (no record created since it was read).
    fn basis(
        &self,
        key: &str,
        names: &KeyNames,
        state: State,
        before: Before,
        claimed: Option<&str>,
    ) -> Result<Basis, StoreError> {
        let mark = state.mark()?;
        self.observe(key, mark, before, state.deletions)?;
        let records = state
            .flights
            .iter()
            .filter(|kv| claimed.is_none_or(|share| kv.key() != share.as_bytes()))
            .map(|kv| Record::parse(kv.value()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| unexpected(Found::Verdict("a record of a write that is not one".into())))?;
        let wait_unchanged = unchanged(&names.wait, state.wait.as_ref());
        let compares = vec![
            unchanged(&names.mark, state.mark.as_ref()),
            wait_unchanged.clone(),
            unchanged(self.names.held(), None),
            Compare::create_revision(names.flights.as_str(), CompareOp::Less, state.revision + 1).with_prefix(),
        ];
        let wait = state.wait()?;
        Ok(Basis {
            mark,
            wait,
            wait_unchanged,
            held: state.held,
            records,
            deletions: state.deletions,
            compares,
            guessed: false,
            answers: true,
        })
    }
}

impl Inner {
    /// Counts a guess that held (`missed` false) or failed its comparisons.
    fn note_guess(&self, missed: bool) {
        let score = |s: u32| Some(if missed { (s + MISS_WEIGHT).min(MISSES_AT_MOST) } else { s.saturating_sub(1) });
        let _ = self.guesses.fetch_update(Ordering::Relaxed, Ordering::Relaxed, score);
    }

    /// Whether guesses fail often enough lately to carry the reads.
    fn guesses_miss(&self) -> bool {
        self.guesses.load(Ordering::Relaxed) > MISSES_READ_ABOVE
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
    /// other writes of the key are in flight: the decision made on what the
    /// replica believes of the key (then on what etcd answers), committed by
    /// one transaction that compares what it was made on and answers the
    /// key's state when something moved, made again then.
    pub(super) async fn turn(
        self: &Arc<Self>,
        key: &str,
        token: u64,
        turn: Turn,
        wait: Duration,
    ) -> Result<Entered, StoreError> {
        let deadline = Instant::now() + wait;
        let alone = !matches!(turn, Turn::Write { alone: false, .. });
        let names = self.names.of(key);
        let (mark_key, wait_key) = (&names.mark, &names.wait);
        let mut pause = Duration::from_millis(1);
        let mut waiting = Waiting::default();
        let mut tries = 0u32;
        // This replica's idle share of the key, which this turn ends.
        let mut claimed = Claimed(self.claim_share(key, token), self);
        // The key's state as a failed comparison answered it, and what this
        // replica knew before that call.
        let mut answered: Option<(State, Before)> = None;
        loop {
            tries += 1;
            let mut before = self.knowledge.before(key);
            let guess = match turn {
                Turn::Write { .. } if tries == 1 => self.guess(before, &names, token, claimed.0.as_deref()),
                _ => None,
            };
            let basis = match (guess, answered.take()) {
                (Some(guess), _) => guess,
                (None, Some((state, sent))) => {
                    before = sent;
                    self.basis(key, &names, state, before, claimed.0.as_deref())?
                }
                (None, None) => {
                    let state = self.read(&names, "reading a key's turn").await?;
                    self.basis(key, &names, state, before, claimed.0.as_deref())?
                }
            };
            let mark = basis.mark;
            if let Some(current) = mark.filter(|m| token < *m) {
                self.knowledge.remember(key, current, basis.deletions);
                return Ok(Entered::Stale { current });
            }
            if let Some(held) = &basis.held {
                let left = self.held_left(held).await?;
                return Err(StoreError::Held { store: STORE, left });
            }
            if matches!(turn, Turn::Raise) && mark == Some(token) {
                return Ok(Entered::Accepted { previous: mark, in_flight: InFlight::default() });
            }
            let waiting_token = basis.wait;
            // A write below a waiting raise is refused; the fence API's raise
            // is not (the mark may go to it; the higher one still waits).
            if let Some(higher) = waiting_token.filter(|w| *w > token && !matches!(turn, Turn::Raise)) {
                return Ok(Entered::Superseded { waiting: higher });
            }
            let records = &basis.records;
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
                    waiting.end(self, wait_key, token).await;
                    return Ok(Entered::TimedOut);
                }
                // A write's record takes the place of the share it ends (one
                // put, not a put and a delete): the share's token is below
                // this one, so the mark moves, and every decision made on the
                // share's record fails its comparison of the mark.
                let record = match turn {
                    Turn::Write { lease_id, .. } => {
                        Some((claimed.0.clone().unwrap_or_else(|| self.record_key(&names)), lease_id))
                    }
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
                // A write that joins others leaves the wait to the turn that
                // put it (a strict write waiting at this token, say).
                let decides_wait = free && waiting_token.is_some_and(|w| w <= token);
                if decides_wait {
                    // Ours, or a lower or equal one: this raise decides them.
                    then.push(TxnOp::delete(wait_key.as_str(), None));
                }
                if let (Some(share), None) = (&claimed.0, &record) {
                    then.push(TxnOp::delete(share.as_str(), None));
                }
                let bytes = 3 * (mark_key.len() + wait_key.len() + names.flights.len()) + 256;
                let txn = Txn::new().when(basis.compares).and_then(then).or_else(if basis.answers {
                    self.read_ops(&names)
                } else {
                    Vec::new()
                });
                // Whatever happens from here, the record (if the
                // transaction wrote it before its answer was lost) ends.
                let pending = Pending(record.as_ref().map(|(r, _)| r.clone()), self);
                let context = "raising a mark and recording the write";
                let compared = basis.guessed.then_some(basis.deletions);
                let written = record.as_ref().map(|(r, _)| r.as_str());
                let (entered, responses, revision) = self.batched(context, key, bytes, compared, written, txn).await?;
                if !entered {
                    // Something moved since the decision was made (nothing
                    // was written): decide again on what etcd answered.
                    let _ = pending.take();
                    // No answer when the batch's own comparisons failed.
                    if basis.answers && !responses.is_empty() {
                        answered = Some((self.state(responses, revision)?, before));
                    }
                    if basis.guessed {
                        self.note_guess(true);
                    }
                    continue;
                }
                if basis.guessed {
                    self.note_guess(false);
                }
                // The transaction deleted the share's record, or wrote its own there.
                claimed.0 = None;
                let deletions = basis.deletions;
                if decides_wait {
                    waiting.deleted();
                }
                self.knowledge.remember(key, token, deletions);
                let mut last = self.last_commit.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if last.as_deref() != Some(key) {
                    *last = Some(key.to_owned());
                }
                drop(last);
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
            // The turn waits: the share it claimed becomes a record like any
            // other, and goes (kept, it would hold the key for every other
            // replica, and two replicas each keeping theirs would wait on
            // each other).
            drop(std::mem::replace(&mut claimed, Claimed(None, self)));
            let now = Instant::now();
            if now >= deadline {
                waiting.end(self, wait_key, token).await;
                return Ok(Entered::TimedOut);
            }
            // Other writes are in flight: wait for them, the token under
            // `wait/` (on a lease of its own, as long as the wait) so writes
            // of the old mark that come meanwhile are refused, and every
            // replica's share of the key ends.
            if waiting_token.is_none_or(|w| w < token) {
                let lease_id = waiting.lease(self, deadline - now).await?;
                let txn = Txn::new().when([basis.wait_unchanged]).and_then([TxnOp::put(
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
