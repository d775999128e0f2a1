//! Whether the etcd store may take fenced writes: is it reachable, is it
//! the store this replica used, are writes held after a confirmation; the
//! health check that keeps these current with no traffic, and an
//! operator's confirmation.
//!
//! etcd keeps what it acknowledged, so a store that forgot is one that was
//! replaced: restored from an older snapshot, or a new cluster on the same
//! endpoints. Either shows as an identity (`P identity`) other than the
//! one adopted or none, a cluster id other than the one adopted, a revision
//! below one seen, or a mark below one seen. Any of these is a `Distrust`:
//! fenced writes are refused until an operator confirms the store as it is
//! (`POST /fences/store/confirm`, `fencegate fence confirm-store`). The
//! confirmation writes a new identity naming the one it replaces, raises
//! this replica's remembered marks back, and holds fenced writes for the
//! longest write lease (`P held`, under a lease as long): writes admitted
//! before may still be in flight, and their records went with the old
//! store. The other replicas see the identity name theirs as replaced,
//! raise their own marks back and adopt it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{PoisonError, Weak};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::client::c_get;
use super::lease::LEASE_MARGIN;
use super::names::mark_value;
use super::{Inner, STORE};
use crate::fence::store::knowledge::{judge_identity, new_identity, Before, Judgement, Knowledge, Known};
use crate::fence::store::{Confirmed, Distrust, Doubt, StoreError};

/// How often a replica reads the store's identity and size when nothing
/// else does: how soon `/readyz` sees etcd come back.
pub(super) const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// Marks raised back per transaction after a confirmation, and their keys'
/// bytes: etcd refuses more than `--max-txn-ops` (128 by default)
/// operations on one level, and requests over 1.5 MiB.
const RESTORE_BATCH: usize = 64;
const RESTORE_BYTES: usize = 256 * 1024;

/// Whether the last call reached etcd and was answered in time.
#[derive(Debug, Default)]
pub(super) struct Reachability(AtomicBool);

/// The etcd cluster this replica adopted (0: none yet) and the highest
/// revision it saw.
#[derive(Debug, Default)]
pub(super) struct Cluster {
    id: AtomicU64,
    revision: AtomicI64,
}

/// The refusal a distrusted store answers with, if it is one.
fn refusal(known: &Known) -> Result<(), StoreError> {
    match &known.distrust {
        Some(why) => Err(StoreError::Distrusted(why.clone())),
        None => Ok(()),
    }
}

fn distrusted(doubt: Doubt) -> StoreError {
    StoreError::Distrusted(Distrust { store: STORE, doubt })
}

impl Inner {
    /// Refuses while the store is distrusted; judges it at first use.
    pub(super) async fn trusted(&self) -> Result<(), StoreError> {
        {
            let known = self.knowledge.known();
            refusal(&known)?;
            if known.id.is_some() {
                return Ok(());
            }
        }
        self.judge().await?;
        let known = self.knowledge.known();
        match (&known.distrust, &known.id) {
            (Some(why), _) => Err(StoreError::Distrusted(why.clone())),
            (None, Some(_)) => Ok(()),
            (None, None) => Err(distrusted(Doubt::NoIdentity)),
        }
    }

    /// Refuses while the store is distrusted: checked again by a batch
    /// before it goes and once it is answered, as the health check may
    /// distrust the store (a mark lost, a lease gone) while turns that began
    /// before wait their turn or ride in a batch.
    pub(super) fn not_distrusted(&self) -> Result<(), StoreError> {
        refusal(&self.knowledge.known())
    }

    /// The highest revision seen: what an answer to a call sent now must
    /// not be below (etcd's reads are linearizable: a call sent after an
    /// answer sees at least its revision; calls in flight together may
    /// answer in any order).
    pub(super) fn revision_floor(&self) -> i64 {
        self.cluster.revision.load(Ordering::Acquire)
    }

    /// The header of an answer from cluster `id` at `revision`, to a call
    /// sent when the highest revision seen was `floor`: another cluster, or
    /// a revision below the floor, is a store that was replaced.
    pub(super) fn check_cluster(&self, id: u64, revision: i64, floor: i64) -> Result<(), StoreError> {
        let adopted = self.cluster.id.load(Ordering::Acquire);
        if adopted != 0 && adopted != id {
            let doubt = Doubt::ClusterChanged { was: format!("{adopted:x}"), now: format!("{id:x}") };
            self.distrust(doubt.clone(), true);
            return Err(distrusted(doubt));
        }
        self.cluster.revision.fetch_max(revision, Ordering::AcqRel);
        if adopted != 0 && revision < floor {
            let doubt = Doubt::RevisionWentBack { seen: floor, found: revision };
            self.distrust(doubt.clone(), true);
            return Err(distrusted(doubt));
        }
        Ok(())
    }

    /// A mark answered for `key` below one this replica saw is a store that lost writes.
    pub(super) fn observe(
        &self,
        key: &str,
        found: Option<u64>,
        before: Before,
        deletions: u64,
    ) -> Result<(), StoreError> {
        // The deletions counter never goes back in a store that keeps what
        // it acknowledged: one that did was restored from an older snapshot.
        // Below the count known before the call (an answer that saw a later
        // count may have been noted since).
        let known = before.deletions;
        if deletions < known {
            let doubt = Doubt::DeletionsWentBack { seen: known, found: deletions };
            self.distrust(doubt.clone(), true);
            return Err(distrusted(doubt));
        }
        let Some(seen) = Knowledge::went_back(before, found, deletions) else {
            self.knowledge.note_deletions(deletions);
            return Ok(());
        };
        self.distrust(Doubt::MarkWentBack { key: key.to_owned(), found, seen }, true);
        Err(distrusted(Doubt::MarkLost { key: key.to_owned() }))
    }

    /// The store lost lease `id` before it could have ended.
    pub(super) fn distrust_lease(&self, id: i64) {
        self.distrust(Doubt::LeaseLost { id }, true);
    }

    fn distrust(&self, doubt: Doubt, loud: bool) {
        let distrust = Distrust { store: STORE, doubt };
        // The records the shares stand on may have gone with the store.
        self.stop_shares(false);
        if self.knowledge.distrust(distrust.clone()) && loud {
            error!(
                error = %distrust,
                "fenced writes are refused until an operator confirms the etcd fence store \
                 (POST /fences/store/confirm on the admin listener, or `fencegate fence confirm-store`)"
            );
        }
    }

    /// The identity, its previous one, the deletions counted, and the
    /// cluster and revision of the answer.
    async fn read_identity(&self) -> Result<(Option<String>, Option<String>, u64, u64, i64), StoreError> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.names.identity(), None),
            TxnOp::get(self.names.deletions(), None),
            TxnOp::get(self.names.held(), None),
        ]);
        let mut answer = self
            .call("reading the fence store's identity", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        let header = answer.take_header().ok_or_else(|| super::unexpected(crate::fence::store::Found::Empty))?;
        let mut kvs = answer.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(mut get) => get.take_kvs().pop(),
            _ => None,
        });
        let identity = kvs.next().flatten();
        let deletions = kvs.next().flatten().map_or(0, |kv| kv.version().max(0) as u64);
        match kvs.next().flatten() {
            Some(held) => {
                let _ = self.held_left(&held).await;
            }
            None => *self.held_until.lock().unwrap_or_else(PoisonError::into_inner) = None,
        }
        let text = identity.map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_default();
        let mut words = text.split(' ').filter(|w| !w.is_empty() && *w != "-").map(str::to_owned);
        Ok((words.next(), words.next(), deletions, header.cluster_id(), header.revision()))
    }

    /// Reads the identity and judges it; adopts, restores or distrusts.
    pub(super) async fn judge(&self) -> Result<(), StoreError> {
        let _one = self.transition.lock().await;
        let floor = self.revision_floor();
        let counted = self.knowledge.known().deletions;
        let (id, previous, deletions, cluster, revision) = self.read_identity().await?;
        let ours = self.knowledge.known().id.clone();
        match judge_identity(ours.as_deref(), id.as_deref(), previous.as_deref()) {
            Judgement::Create => {
                let identity = new_identity()?;
                let key = self.names.identity();
                let txn = Txn::new()
                    .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.as_str(), format!("{identity} -"), None)]);
                self.txn_unchecked("writing the fence store's identity", txn).await?;
                let (id, _, deletions, cluster, revision) = self.read_identity().await?;
                let Some(id) = id else { return Err(distrusted(Doubt::IdentityVanished)) };
                info!(identity = %id, "the etcd fence store had no identity: it has one now, taken as a new store");
                self.adopt(id, deletions, cluster, revision);
            }
            Judgement::Adopt(id) => {
                info!(identity = %id, cluster = %format!("{cluster:x}"), "using the etcd fence store");
                self.adopt(id, deletions, cluster, revision);
            }
            Judgement::Ours => {
                self.check_cluster(cluster, revision, floor)?;
                if deletions < counted {
                    self.distrust(Doubt::DeletionsWentBack { seen: counted, found: deletions }, true);
                }
                self.knowledge.note_deletions(deletions);
            }
            Judgement::Confirmed(id) => {
                self.distrust(Doubt::Restoring { identity: id.clone() }, false);
                self.drop_leases().await;
                let restored = self.restore().await?;
                self.lengthen_hold().await?;
                warn!(identity = %id, restored, "adopting the etcd fence store an operator confirmed");
                self.adopt(id, deletions, cluster, revision);
            }
            Judgement::Distrust(doubt) => self.distrust(doubt, true),
        }
        Ok(())
    }

    fn adopt(&self, id: String, deletions: u64, cluster: u64, revision: i64) {
        self.cluster.id.store(cluster, Ordering::Release);
        self.cluster.revision.store(revision, Ordering::Release);
        self.knowledge.adopt(id, deletions);
    }

    /// A transaction whose header is not judged (the judge's own writes).
    async fn txn_unchecked(&self, context: &'static str, txn: Txn) -> Result<bool, StoreError> {
        let answer = self.call(context, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        });
        Ok(answer.await?.succeeded())
    }

    /// Revokes every lease this replica held before the store was
    /// confirmed, and forgets them: a store restored from a snapshot brings
    /// back records of writes that ended long ago, under a lease this
    /// replica would otherwise keep alive, and they would hold their keys
    /// for its whole life. The writes that were in flight are covered by
    /// the hold after the confirmation; the next write gets a new lease.
    async fn drop_leases(&self) {
        for id in self.lease.forget_all() {
            let revoked = self
                .call("revoking a lease from before the confirmation", |mut c| async move { c.lease_revoke(id).await });
            if let Err(e) = revoked.await {
                tracing::debug!(error = %e, lease = id, "revoking a lease from before the confirmation");
            }
        }
    }

    /// Raises every mark this replica remembers back into the store, many
    /// keys to a transaction (each key a nested transaction of it).
    async fn restore(&self) -> Result<u64, StoreError> {
        let mut seen = self.knowledge.all_seen().into_iter().peekable();
        let mut restored = 0;
        while seen.peek().is_some() {
            let (mut raises, mut bytes) = (Vec::new(), 0);
            while raises.len() < RESTORE_BATCH && bytes < RESTORE_BYTES {
                let Some((key, mark)) = seen.next() else { break };
                let mark_key = self.names.mark(&key);
                bytes += 2 * mark_key.len() + 64;
                // Raised unless the store has it as high already.
                raises.push(TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(mark_key.as_str(), CompareOp::Greater, mark_value(mark))])
                        .or_else([TxnOp::put(mark_key.as_str(), mark_value(mark), None)]),
                ));
            }
            restored += raises.len() as u64;
            self.txn_unchecked("restoring marks into the fence store", Txn::new().and_then(raises)).await?;
        }
        Ok(restored)
    }

    /// Lengthens the hold after a confirmation to this replica's own
    /// [`Inner::hold_for`], from now, when the hold in the store is still on
    /// and ends sooner: writes this replica let on before the store was replaced
    /// may run that long (its routes' leases may be longer than the
    /// confirming replica's). The longer hold's lease replaces the shorter
    /// one's, compared, so replicas lengthening it at once keep the longest.
    async fn lengthen_hold(&self) -> Result<(), StoreError> {
        let hold = self.hold_for();
        let key = self.names.held();
        for _ in 0..3 {
            let options = GetOptions::new();
            let found = self.call("reading the hold after a confirmation", |mut c| c_get(&mut c, key, &options));
            let found = found.await?.take_kvs().pop();
            // No hold left: it ended before this replica saw the
            // confirmation (it was not reaching etcd), and is not brought back.
            let Some(held) = &found else { return Ok(()) };
            // `held_left` may say up to a second more than is left (etcd's
            // whole seconds): long enough only with that second taken off.
            if self.held_left(held).await?.saturating_sub(Duration::from_secs(1)) >= hold {
                return Ok(());
            }
            let ttl = hold.as_secs() as i64 + i64::from(hold.subsec_nanos() > 0);
            let lease =
                self.call("holding fenced writes after the confirmation", |mut c| async move {
                    c.lease_grant(ttl, None).await
                })
                .await?
                .id();
            let txn = Txn::new().when([super::unchanged(key, found.as_ref())]).and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(lease)),
            )]);
            if self.txn_unchecked("lengthening the hold after a confirmation", txn).await? {
                *self.held_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + hold);
                return Ok(());
            }
            let _ = self.call("ending an unused hold", |mut c| async move { c.lease_revoke(lease).await }).await;
        }
        // Other replicas kept changing the hold: this one takes the store
        // at the next health check, not with a hold that may end too soon.
        Err(StoreError::Failed {
            store: STORE,
            context: "lengthening the hold after a confirmation",
            message: "the hold kept changing under this replica; trying again at the next health check".into(),
        })
    }

    /// An operator's word that the store may be trusted as it is now.
    pub(super) async fn confirm(&self) -> Result<Confirmed, StoreError> {
        let _one = self.transition.lock().await;
        let (id, _, deletions, cluster, revision) = self.read_identity().await?;
        let previous = self.knowledge.known().id.clone().or(id).unwrap_or_default();
        let identity = new_identity()?;
        self.distrust(Doubt::Restoring { identity: identity.clone() }, false);
        self.drop_leases().await;
        let restored = self.restore().await?;
        let held = self.hold_for();
        let ttl = held.as_secs() as i64 + i64::from(held.subsec_nanos() > 0);
        let hold = self
            .call("holding fenced writes after the confirmation", |mut c| async move { c.lease_grant(ttl, None).await })
            .await?;
        let previous_word = if previous.is_empty() { "-" } else { previous.as_str() };
        let txn = Txn::new().and_then([
            TxnOp::put(self.names.held(), "", Some(PutOptions::new().with_lease(hold.id()))),
            TxnOp::put(self.names.identity(), format!("{identity} {previous_word}"), None),
        ]);
        self.txn_unchecked("writing the fence store's new identity", txn).await?;
        *self.held_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + held);
        warn!(identity = %identity, previous = %previous, restored, "an operator confirmed the etcd fence store");
        // The cluster and revision as they are now are the ones trusted.
        self.adopt(identity.clone(), deletions, cluster, revision);
        Ok(Confirmed { identity, previous, restored, held })
    }

    /// How long fenced writes are held after a confirmation: the longest
    /// lease a write may have, and at least the time the other replicas take
    /// to see the new identity.
    fn hold_for(&self) -> Duration {
        let longest = *self.longest.lock().unwrap_or_else(PoisonError::into_inner);
        (longest + LEASE_MARGIN).max(HEALTH_EVERY + self.timeout * 2)
    }

    /// Notes whether a call reached etcd, saying so when that changes.
    pub(super) fn note_answer(&self, outcome: Result<(), &StoreError>) {
        if self.reachable.0.swap(outcome.is_ok(), Ordering::AcqRel) == outcome.is_ok() {
            return;
        }
        self.calls.reachable(outcome.is_ok());
        match outcome {
            Err(e) => warn!(error = %e, "the etcd fence store stopped answering: fenced writes get 503"),
            Ok(()) => info!("the etcd fence store answers"),
        }
    }

    /// Why fenced writes are refused now, if they are (`/readyz`).
    pub(super) fn unready(&self) -> Option<String> {
        if let Some(why) = &self.knowledge.known().distrust {
            return Some(why.to_string());
        }
        if !self.reachable.0.load(Ordering::Acquire) {
            return Some("the etcd fence store is unreachable or slower than [fences] timeout".into());
        }
        let until = *self.held_until.lock().unwrap_or_else(PoisonError::into_inner);
        let left = until.map(|u| u.saturating_duration_since(Instant::now())).unwrap_or_default();
        (!left.is_zero()).then(|| StoreError::Held { store: STORE, left }.to_string())
    }

    /// One health check: is the store there, is it the one we know, and how
    /// many keys has it.
    async fn check(&self) {
        if let Err(e) = self.judge().await {
            tracing::debug!(error = %e, "checking the etcd fence store's identity");
            return;
        }
        // The key this replica committed last still has its mark: a store
        // restored from a snapshot taken before that commit has lost it, and
        // is noticed even when its revision has since moved past the ones
        // this replica saw. A check of the last commit only: an earlier
        // commit lost while that key was raised again since the restore
        // shows when its own key is next read.
        let last = self.last_commit.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(key) = last.filter(|_| self.knowledge.known().distrust.is_none()) {
            let before = self.knowledge.before(&key);
            let observed = match self.read(&self.names.of(&key), "reading the mark this replica committed last").await {
                Ok(state) => state.mark().and_then(|mark| self.observe(&key, mark, before, state.deletions)),
                Err(e) => Err(e),
            };
            if let Err(e) = observed {
                tracing::debug!(error = %e, "checking the mark this replica committed last");
                return;
            }
        }
        let options = GetOptions::new().with_prefix().with_count_only();
        let marks = self.names.marks();
        let counted = self.call("counting the fence store's keys", |mut c| {
            let (marks, options) = (marks.clone(), options.clone());
            async move { c.get(marks, Some(options)).await }
        });
        if let Ok(answer) = counted.await {
            self.tracked.store(answer.count().max(0) as usize, Ordering::Relaxed);
        }
    }
}

/// Checks the store every [`HEALTH_EVERY`], so readiness follows etcd going
/// and coming back with no traffic, and a replaced store is noticed before
/// the next write.
pub(super) async fn health(inner: Weak<Inner>) {
    loop {
        if let Some(inner) = inner.upgrade() {
            inner.check().await;
        } else {
            return;
        }
        tokio::time::sleep(HEALTH_EVERY).await;
    }
}
