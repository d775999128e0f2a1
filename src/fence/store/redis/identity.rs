//! The Redis store's identity: `P identity` holds it (`id`, `previous`,
//! `deletions`), written at first use. A Redis that lost it (restarted
//! without persistence, flushed), or that answers with a mark below one
//! this replica saw (a failover to a replica that missed writes), is not
//! trusted until an operator confirms it (see `health`). What the replica
//! knows of it: `store/knowledge.rs`.

use tracing::{info, warn};

use super::scripts::{millis, Reply, Verdict};
use super::{distrusted, Inner};
use crate::fence::store::knowledge::{judge_identity, new_identity, Before, Judgement, Knowledge};
use crate::fence::store::{Doubt, StoreError};

impl Inner {
    /// The identity to run scripts with: the one adopted, or the store's
    /// (created at first use).
    pub(super) async fn identity(&self) -> Result<String, StoreError> {
        {
            let known = self.knowledge.known();
            if let Some(why) = &known.distrust {
                return Err(StoreError::Distrusted(why.clone()));
            }
            if let Some(id) = &known.id {
                return Ok(id.clone());
            }
        }
        self.judge().await?;
        let known = self.knowledge.known();
        match (&known.distrust, &known.id) {
            (Some(why), _) => Err(StoreError::Distrusted(why.clone())),
            (None, Some(id)) => Ok(id.clone()),
            (None, None) => Err(distrusted(Doubt::NoIdentity)),
        }
    }

    pub(super) async fn read_identity(&self) -> Result<(Option<String>, Option<String>, u64), StoreError> {
        let mut read = redis::cmd("HMGET");
        read.arg(self.names.identity()).arg("id").arg("previous").arg("deletions");
        let (id, previous, deletions): (Option<String>, Option<String>, Option<u64>) =
            self.query(&read, "reading the fence store's identity").await?;
        Ok((id.filter(|s| !s.is_empty()), previous.filter(|s| !s.is_empty()), deletions.unwrap_or_default()))
    }

    /// What the store's identity means for this replica, read afresh under
    /// the transition lock (another task may have adopted one meanwhile).
    pub(super) async fn judge(&self) -> Result<(), StoreError> {
        let _one = self.transition.lock().await;
        let (id, previous, deletions) = self.read_identity().await?;
        let ours = self.knowledge.known().id.clone();
        match judge_identity(ours.as_deref(), id.as_deref(), previous.as_deref()) {
            Judgement::Create => {
                let mut create = redis::cmd("HSETNX");
                create.arg(self.names.identity()).arg("id").arg(new_identity()?);
                self.query::<i64>(&create, "writing the fence store's identity").await?;
                let (id, _, deletions) = self.read_identity().await?;
                let Some(id) = id else { return Err(distrusted(Doubt::IdentityVanished)) };
                info!(identity = %id, "the Redis fence store had no identity: it has one now, taken as a new store");
                self.knowledge.adopt(id, deletions);
            }
            Judgement::Adopt(id) => {
                info!(identity = %id, "using the Redis fence store");
                self.knowledge.adopt(id, deletions);
            }
            Judgement::Ours => self.knowledge.note_deletions(deletions),
            Judgement::Confirmed(id) => self.take_confirmed(id, deletions).await?,
            Judgement::Distrust(doubt) => self.distrust(doubt, true),
        }
        Ok(())
    }

    /// Adopts identity `id`, which an operator confirmed through another
    /// replica, once this replica's own marks are back in the store.
    async fn take_confirmed(&self, id: String, deletions: u64) -> Result<(), StoreError> {
        // Until this replica's own marks are back in it, nothing goes.
        self.distrust(Doubt::Restoring { identity: id.clone() }, false);
        let restored = self.restore().await?;
        // This replica's writes admitted before the loss may still be in
        // flight, with leases the confirming replica may not know of: the
        // hold lasts at least as long as they may.
        let hold = self.hold_for();
        let mut invocation = self.scripts.hold.prepare_invoke();
        invocation.key(self.names.identity()).arg(&id).arg(millis(hold));
        let reply = Reply::parse(self.invoke(&invocation, false).await?.0)?;
        if reply.verdict != Verdict::Ok {
            // The identity changed again meanwhile: judged afresh next time.
            return Ok(());
        }
        let left = reply.ms()?;
        warn!(
            identity = %id,
            restored,
            held_for = %humantime::format_duration(left),
            "adopting the Redis fence store's identity an operator confirmed"
        );
        self.knowledge.adopt(id, deletions);
        self.note_hold(left);
        Ok(())
    }

    /// Checks the store's answer `found` for `key` against what this
    /// replica knew `before` the call (see [`Knowledge::went_back`]).
    pub(super) fn observe(
        &self,
        key: &str,
        found: Option<u64>,
        before: Before,
        reply: &Reply,
    ) -> Result<(), StoreError> {
        let Some(seen) = Knowledge::went_back(before, found, reply.deletions) else { return Ok(()) };
        self.distrust(Doubt::MarkWentBack { key: key.to_owned(), found, seen }, true);
        Err(distrusted(Doubt::MarkLost { key: key.to_owned() }))
    }

    /// Raises every remembered mark back into the store, whatever its
    /// identity says (an operator asked for it).
    pub(super) async fn restore(&self) -> Result<u64, StoreError> {
        let marks = self.knowledge.all_seen();
        let mut restored = 0;
        for chunk in marks.chunks(500) {
            let mut pipe = redis::pipe();
            for (key, mark) in chunk {
                let mut invocation = self.scripts.raise.prepare_invoke();
                invocation
                    .key(self.names.mark(key))
                    .key(self.names.index())
                    .key(self.names.identity())
                    .arg("*")
                    .arg(mark.to_string())
                    .arg(key.as_str());
                pipe.invoke_script(&invocation).ignore();
            }
            // Restored marks, like raised ones, reach the replicas asked for.
            if self.min_replicas > 0 {
                pipe.cmd("WAIT").arg(self.min_replicas).arg(millis(self.replica_timeout));
            }
            self.query_pipe(&pipe, "restoring marks into the fence store").await?;
            restored += chunk.len() as u64;
        }
        Ok(restored)
    }
}
