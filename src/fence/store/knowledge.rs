//! What a replica knows of a store that replicas share (Redis, etcd): the
//! store's identity as this replica adopted it, whether it trusts the store,
//! and the highest mark it saw per key. A store that lost its identity, or
//! that answers a mark below one this replica saw, is not trusted until an
//! operator confirms it; each shared store reads and writes its identity in
//! its own way (`redis/identity.rs`, `etcd/trust.rs`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::{CallStats, Distrust, Doubt, StoreError};
use crate::fence::KeyMap;

/// The store's identity and what it means, as this replica last judged it.
#[derive(Debug, Default)]
pub(in crate::fence::store) struct Known {
    /// The identity adopted; `None` until the store was first reached.
    pub id: Option<String>,
    /// The deletions counted in the identity when last seen: when it moves,
    /// an operator deleted marks and the ones remembered may be gone for good.
    pub deletions: u64,
    /// Why the store is not trusted, until an operator confirms it.
    pub distrust: Option<Distrust>,
    /// Until when fenced writes are held after an operator's confirmation,
    /// as last read from the store (`/readyz`; the store itself decides).
    pub held_until: Option<Instant>,
}

/// What this replica knows of the store: [`Known`], and the highest mark it
/// saw per key, up to `seen_cap` keys: a token below it is refused without
/// a round trip, and a store that answers below it has lost writes.
pub(in crate::fence::store) struct Knowledge {
    known: Mutex<Known>,
    seen: KeyMap<u64>,
    seen_cap: usize,
    /// Where trust is shown (`fencegate_store_trusted`).
    calls: Arc<CallStats>,
}

/// What this replica knew of a key before a call ([`Knowledge::before`]).
#[derive(Debug, Clone, Copy)]
pub(in crate::fence::store) struct Before {
    pub(in crate::fence::store) seen: Option<u64>,
    pub(in crate::fence::store) deletions: u64,
}

/// What the identity found in the store means for this replica.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::fence::store) enum Judgement {
    /// First contact with an empty store: whoever writes an identity first,
    /// every replica adopts it.
    Create,
    /// First contact with a store that has an identity: adopt it.
    Adopt(String),
    /// The identity this replica adopted: only its deletions count.
    Ours,
    /// An operator confirmed the store through another replica: restore
    /// this replica's marks into it, then adopt it.
    Confirmed(String),
    /// Not the store this replica used.
    Distrust(Doubt),
}

/// Judges the identity `found` (naming `previous`) when this replica
/// adopted `ours`.
pub(in crate::fence::store) fn judge_identity(
    ours: Option<&str>,
    found: Option<&str>,
    previous: Option<&str>,
) -> Judgement {
    match (ours, found) {
        (None, None) => Judgement::Create,
        (None, Some(id)) => Judgement::Adopt(id.to_owned()),
        (Some(ours), Some(id)) if id == ours => Judgement::Ours,
        // Only a confirmation names the identity it replaces; another
        // store's (a new one, say) must not clear the marks a confirm restores.
        (Some(ours), Some(id)) if previous == Some(ours) => Judgement::Confirmed(id.to_owned()),
        (Some(ours), Some(id)) => Judgement::Distrust(Doubt::IdentityChanged { was: ours.into(), now: id.into() }),
        (Some(ours), None) => Judgement::Distrust(Doubt::IdentityLost { was: ours.into() }),
    }
}

impl Knowledge {
    /// Knows nothing yet; shows its trust in `calls`.
    pub fn new(seen_cap: usize, calls: Arc<CallStats>) -> Knowledge {
        Knowledge { known: Mutex::default(), seen: KeyMap::default(), seen_cap, calls }
    }

    pub fn known(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mark this replica last saw for `key`.
    pub fn seen(&self, key: &str) -> Option<u64> {
        self.seen.get(key).map(|m| *m)
    }

    pub fn seen_keys(&self) -> usize {
        self.seen.len()
    }

    /// Every mark remembered, to raise back into a store an operator confirmed.
    pub fn all_seen(&self) -> Vec<(String, u64)> {
        self.seen.iter().map(|e| (e.key().to_string(), *e.value())).collect()
    }

    /// What this replica knew of `key` before a call: the call's answer
    /// must not be below it.
    pub fn before(&self, key: &str) -> Before {
        // The deletions first: a mark remembered after them is from a reply
        // at least as new.
        let deletions = self.known().deletions;
        Before { seen: self.seen(key), deletions }
    }

    /// The mark this replica saw for a key when the store answered `found`
    /// for it below that, with `deletions` as counted `before` the call.
    /// Redis runs a connection's calls in the order sent, and the mark
    /// `before` saw was answered before this call was sent: a healthy store
    /// cannot answer less (unless an operator deleted marks since).
    pub fn went_back(before: Before, found: Option<u64>, deletions: u64) -> Option<u64> {
        let seen = before.seen?;
        if deletions != before.deletions {
            return None;
        }
        found.is_none_or(|m| m < seen).then_some(seen)
    }

    /// Remembers that `key`'s mark reached `mark` (in a reply that counted
    /// `deletions`).
    pub fn remember(&self, key: &str, mark: u64, deletions: u64) {
        // Held while remembering: a deletion seen meanwhile clears after.
        let known = self.known();
        if deletions != known.deletions {
            return;
        }
        if let Some(mut m) = self.seen.get_mut(key) {
            *m = (*m).max(mark);
        } else if self.seen.len() < self.seen_cap {
            self.seen.entry(key.into()).and_modify(|m| *m = (*m).max(mark)).or_insert(mark);
        }
        drop(known);
    }

    /// The store's deletions counter only grows: a larger one means marks
    /// were deleted, and the remembered ones may be gone for good.
    pub fn note_deletions(&self, deletions: u64) {
        let mut known = self.known();
        if deletions > known.deletions {
            known.deletions = deletions;
            // Under the lock: a reply that saw the old count no longer
            // remembers anything once this returns.
            self.seen.clear();
        }
    }

    /// Forgets every mark seen: this replica deleted some.
    pub fn forget_seen(&self) {
        self.seen.clear();
    }

    /// Takes `id` as the store's identity, and trusts it.
    pub fn adopt(&self, id: String, deletions: u64) {
        let mut known = self.known();
        known.id = Some(id);
        known.deletions = deletions;
        known.distrust = None;
        self.calls.trusts(true);
    }

    /// Stops trusting the store; `true` the first time since it was trusted.
    pub fn distrust(&self, distrust: Distrust) -> bool {
        let mut known = self.known();
        let first = known.distrust.is_none();
        known.distrust = Some(distrust);
        self.calls.trusts(false);
        first
    }
}

/// A random identity for a store. Random or nothing: two stores (or two
/// replicas' records) must never be named alike.
pub(in crate::fence::store) fn new_identity() -> Result<String, StoreError> {
    let random = || {
        getrandom::u64().map_err(|e| StoreError::Io {
            context: "reading the system's random source",
            source: Arc::new(std::io::Error::other(e.to_string())),
        })
    };
    Ok(format!("{:016x}{:016x}", random()?, random()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_adopted_at_first_contact_and_any_other_later_is_distrusted() {
        assert_eq!(judge_identity(None, None, None), Judgement::Create);
        assert_eq!(judge_identity(None, Some("a"), Some("z")), Judgement::Adopt("a".into()));
        assert_eq!(judge_identity(Some("a"), Some("a"), None), Judgement::Ours);
        assert_eq!(judge_identity(Some("a"), Some("a"), Some("a")), Judgement::Ours);
        assert_eq!(judge_identity(Some("a"), Some("b"), Some("a")), Judgement::Confirmed("b".into()));
        assert_eq!(
            judge_identity(Some("a"), Some("b"), Some("c")),
            Judgement::Distrust(Doubt::IdentityChanged { was: "a".into(), now: "b".into() })
        );
        assert_eq!(
            judge_identity(Some("a"), Some("b"), None),
            Judgement::Distrust(Doubt::IdentityChanged { was: "a".into(), now: "b".into() })
        );
        assert_eq!(
            judge_identity(Some("a"), None, Some("a")),
            Judgement::Distrust(Doubt::IdentityLost { was: "a".into() })
        );
    }

    #[test]
    fn an_answer_below_a_mark_seen_is_a_loss_unless_marks_were_deleted_since() {
        let knowledge = Knowledge::new(10, Arc::new(CallStats::new("test")));
        // Nothing seen: any answer goes.
        assert_eq!(Knowledge::went_back(knowledge.before("/a"), None, 0), None);
        knowledge.remember("/a", 7, 0);
        let before = knowledge.before("/a");
        assert_eq!(Knowledge::went_back(before, Some(7), 0), None);
        assert_eq!(Knowledge::went_back(before, Some(9), 0), None);
        assert_eq!(Knowledge::went_back(before, Some(6), 0), Some(7));
        assert_eq!(Knowledge::went_back(before, None, 0), Some(7));
        // An operator deleted marks in between: the answer may rightly be lower.
        assert_eq!(Knowledge::went_back(before, None, 1), None);
    }

    #[test]
    fn marks_seen_only_grow_stay_within_their_cap_and_go_when_deletions_move() {
        let knowledge = Knowledge::new(2, Arc::new(CallStats::new("test")));
        knowledge.remember("/a", 5, 0);
        knowledge.remember("/a", 3, 0);
        assert_eq!(knowledge.seen("/a"), Some(5));
        knowledge.remember("/b", 1, 0);
        knowledge.remember("/c", 1, 0);
        assert_eq!((knowledge.seen_keys(), knowledge.seen("/c")), (2, None), "past the cap");
        knowledge.remember("/b", 4, 0);
        assert_eq!(knowledge.seen("/b"), Some(4), "a key remembered still grows at the cap");
        // A reply from before a deletion this replica saw remembers nothing.
        knowledge.note_deletions(1);
        assert_eq!(knowledge.seen_keys(), 0);
        knowledge.remember("/a", 9, 0);
        assert_eq!(knowledge.seen("/a"), None);
        knowledge.remember("/a", 9, 1);
        assert_eq!(knowledge.seen("/a"), Some(9));
        // The counter never goes back: an older count clears nothing.
        knowledge.note_deletions(0);
        assert_eq!(knowledge.seen("/a"), Some(9));
    }

    #[test]
    fn distrust_lasts_until_an_identity_is_adopted() {
        let calls = Arc::new(CallStats::new("test"));
        let knowledge = Knowledge::new(2, calls.clone());
        let lost = Distrust { store: "Redis", doubt: Doubt::IdentityLost { was: "a".into() } };
        assert!(knowledge.distrust(lost.clone()), "the first distrust is told loudly");
        assert!(!knowledge.distrust(lost.clone()), "and only the first");
        assert_eq!(knowledge.known().distrust, Some(lost));
        assert_eq!(calls.trusted.get(), 0, "fencegate_store_trusted shows it");
        knowledge.adopt("b".into(), 4);
        assert_eq!(calls.trusted.get(), 1);
        let known = knowledge.known();
        assert_eq!((known.id.as_deref(), known.deletions, known.distrust.is_none()), (Some("b"), 4, true));
    }

    #[test]
    fn identities_are_random_and_of_one_length() {
        let (a, b) = (new_identity().unwrap(), new_identity().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
