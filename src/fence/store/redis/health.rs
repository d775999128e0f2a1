//! Whether the Redis store may take fenced writes: is it reachable, is it
//! trusted, are writes held after a confirmation; the health check that
//! keeps these current with no traffic, and an operator's confirmation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::flight::LEASE_MARGIN;
use super::scripts::{millis, Reply, Verdict};
use super::{Inner, STORE};
use crate::fence::store::knowledge::{new_identity, Known};
use crate::fence::store::{Confirmed, Distrust, Doubt, StoreError};

/// How often a replica reads the store's identity and size when nothing
/// else does: how soon `/readyz` sees Redis come back.
pub(super) const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// Whether the last call reached Redis and was answered in time.
#[derive(Debug, Default)]
pub(super) struct Reachability(AtomicBool);

impl Reachability {
    /// Notes whether a call `reached` Redis; `true` when that is news.
    fn note(&self, reached: bool) -> bool {
        self.0.swap(reached, Ordering::AcqRel) != reached
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Why fenced writes are refused now, if they are: the store is not
/// trusted, not reachable, or holds writes after a confirmation (in that
/// order: the first needs an operator).
fn unready(known: &Known, reachable: bool, now: Instant) -> Option<String> {
    if let Some(why) = &known.distrust {
        return Some(why.to_string());
    }
    if !reachable {
        return Some("the Redis fence store is unreachable or slower than [fences] timeout".into());
    }
    let left = known.held_until.map(|until| until.saturating_duration_since(now)).unwrap_or_default();
    (!left.is_zero()).then(|| StoreError::Held { store: STORE, left }.to_string())
}

/// How long fenced writes are held after a confirmation, from its moment:
/// the longest lease a write of this replica may have (its routes' now,
/// with the replica wait and margin its writes get, or a longer one it gave
/// before a reload), and at least the time the other replicas take to see
/// the new identity and restore their marks (their health check runs every
/// [`HEALTH_EVERY`], and a check is two calls).
fn hold_for(configured: Duration, given: Duration, replica_wait: Duration, timeout: Duration) -> Duration {
    let configured = configured + replica_wait + LEASE_MARGIN;
    configured.max(given).max(HEALTH_EVERY + timeout * 2)
}

/// Reads the store's identity and size every [`HEALTH_EVERY`], so readiness
/// follows Redis going and coming back with no traffic, and a flushed store
/// is noticed before the next write.
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

impl Inner {
    /// One health check: is the store there, is it the one we know, and how
    /// many keys has it.
    async fn check(&self) {
        // From the first contact on, not from the first write: a replica
        // that took no write yet must still notice the store emptied under
        // it. (An empty store at the first contact is taken as new.)
        // The same read tells of deletions made through other replicas.
        if let Err(e) = self.judge().await {
            tracing::debug!(error = %e, "checking the Redis fence store's identity");
            return;
        }
        // Whether writes are held after a confirmation, for `/readyz` on
        // every replica (a replica started since the confirmation too).
        let invocation = {
            let mut invocation = self.scripts.held.prepare_invoke();
            invocation.key(self.names.identity());
            invocation
        };
        if let Ok((values, _)) = self.invoke(&invocation, false).await {
            if let Ok(left) = Reply::parse(values).and_then(|reply| reply.ms()) {
                self.note_hold(left);
            }
        }
        let mut count = redis::cmd("ZCARD");
        count.arg(self.names.index());
        if let Ok(n) = self.query::<usize>(&count, "counting the fence store's keys").await {
            self.tracked.store(n, Ordering::Relaxed);
        }
    }

    /// Notes whether a call reached Redis, saying so when that changes.
    pub(super) fn note_answer(&self, outcome: Result<(), &StoreError>) {
        if !self.reachable.note(outcome.is_ok()) {
            return;
        }
        self.calls.reachable(outcome.is_ok());
        match outcome {
            Err(e) => warn!(error = %e, "the Redis fence store stopped answering: fenced writes get 503"),
            Ok(()) => info!("the Redis fence store answers"),
        }
    }

    /// Why fenced writes are refused now, if they are (`/readyz`).
    pub(super) fn unready(&self) -> Option<String> {
        unready(&self.knowledge.known(), self.reachable.get(), Instant::now())
    }

    /// Refuses every fenced write until an operator confirms the store
    /// (`loud`: with an ERROR line the first time), or the replica adopts the
    /// identity it confirmed.
    pub(super) fn distrust(&self, doubt: Doubt, loud: bool) {
        let why = Distrust { store: STORE, doubt };
        let shown = loud.then(|| why.to_string());
        if self.knowledge.distrust(why) {
            if let Some(why) = shown {
                error!(
                    "{why}. Fenced writes are refused (503) until an operator restores the fences or confirms the \
                     store: `fencegate fence confirm-store` or POST /fences/store/confirm on the admin listener"
                );
            }
        }
    }

    /// The store holds fenced writes for `left` more (`/readyz` says so).
    pub(super) fn note_hold(&self, left: Duration) {
        let mut known = self.knowledge.known();
        known.held_until = (!left.is_zero()).then(|| Instant::now() + left);
    }

    /// See [`hold_for`].
    pub(super) fn hold_for(&self) -> Duration {
        let replica_wait = if self.min_replicas > 0 { self.replica_timeout } else { Duration::ZERO };
        hold_for(self.flights.configured(), self.flights.longest_given(), replica_wait, self.timeout)
    }

    /// An operator's word that the store may be trusted as it is now: this
    /// replica first raises every mark it remembers back into the store
    /// (nothing it saw goes back), then writes a new identity naming the
    /// old one, which the other replicas then adopt once they have done the
    /// same.
    ///
    /// Writes admitted before the store lost its data may still be in
    /// flight on any replica, and their records are gone with the data: so
    /// the same step holds every replica's fenced writes (503) for the
    /// longest lease a write may have ([`hold_for`]), at least long
    /// enough for the other replicas to restore their marks. Each replica
    /// that adopts the identity lengthens the hold to its own longest lease.
    pub(super) async fn confirm(&self) -> Result<Confirmed, StoreError> {
        let _one = self.transition.lock().await;
        let restored = self.restore().await?;
        let previous = self.knowledge.known().id.clone();
        let found = self.read_identity().await?.0;
        let previous = previous.or(found).unwrap_or_default();
        let id = new_identity()?;
        let hold = self.hold_for();
        let mut invocation = self.scripts.confirm.prepare_invoke();
        invocation.key(self.names.identity()).arg(&id).arg(&previous).arg(millis(hold));
        let reply = Reply::parse(self.invoke(&invocation, false).await?.0)?;
        if reply.verdict != Verdict::Ok {
            return Err(reply.verdict.unexpected());
        }
        // Writes wait on the store's hold; this replica's marks are in it.
        self.knowledge.adopt(id.clone(), reply.deletions);
        self.note_hold(hold);
        warn!(
            identity = %id,
            %previous,
            restored,
            held_for = %humantime::format_duration(hold),
            "an operator confirmed the Redis fence store: fenced writes resume once the writes admitted before it \
             lost its data have ended"
        );
        Ok(Confirmed { identity: id, previous, restored, held: hold })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reachability_is_news_only_when_it_changes() {
        let reachable = Reachability::default();
        assert!(!reachable.get(), "unreachable until a call is answered");
        assert!(reachable.note(true));
        assert!(!reachable.note(true));
        assert!(reachable.get());
        assert!(reachable.note(false));
        assert!(!reachable.note(false));
        assert!(!reachable.get());
    }

    #[test]
    fn readiness_names_distrust_first_then_reachability_then_a_hold() {
        let now = Instant::now();
        let mut known = Known::default();
        assert_eq!(unready(&known, true, now), None);
        let down = unready(&known, false, now).unwrap();
        assert!(down.contains("unreachable"), "{down}");
        known.held_until = Some(now + Duration::from_millis(2500));
        let held = unready(&known, true, now).unwrap();
        assert!(held.contains("held for 3s more"), "{held}");
        assert_eq!(unready(&known, true, now + Duration::from_secs(3)), None, "the hold ran out");
        assert!(unready(&known, false, now).unwrap().contains("unreachable"));
        known.distrust = Some(Distrust { store: STORE, doubt: Doubt::IdentityLost { was: "a".into() } });
        let distrusted = unready(&known, false, now).unwrap();
        assert!(distrusted.contains("identity") && distrusted.contains("was a"), "{distrusted}");
    }

    #[test]
    fn a_hold_covers_the_longest_lease_given_or_configured_and_the_replicas_catching_up() {
        let s = Duration::from_secs;
        let timeout = Duration::from_millis(500);
        // The routes' longest lease, with the replica wait and margin.
        assert_eq!(hold_for(s(85), s(0), s(2), timeout), s(88));
        // A longer lease given before a reload shortened the routes'.
        assert_eq!(hold_for(s(10), s(90), s(0), timeout), s(90));
        // No routes configured yet: long enough for the others' health check.
        assert_eq!(hold_for(s(0), s(0), s(0), timeout), HEALTH_EVERY + timeout * 2);
    }
}
