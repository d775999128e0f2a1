//! Why a store could not answer: [`StoreError`], and the typed findings of
//! a shared store that is not trusted ([`Distrust`]) or that answered
//! something fencegate does not understand ([`Unexpected`]).

use std::sync::Arc;
use std::time::Duration;

/// Why the store could not answer; the fence fails closed (503
/// `store-unavailable`, with this text as the problem's `detail`).
///
/// Cloneable because one commit's outcome answers every raise in it; the
/// sources are shared for that.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// fencegate is shutting down: the store takes no more raises.
    #[error("fence store unavailable: the store is closing")]
    Closing,
    /// The disk under the journal has no room for the raise.
    #[error("fence store unavailable: appending to the fence journal: {0}")]
    DiskFull(#[source] Arc<std::io::Error>),
    /// The journal is full and the fold that empties it is not finishing.
    #[error("fence store unavailable: the journal is full and folding it into the fence store is not finishing")]
    FoldStuck,
    /// The journal is full and the thread that folds it has stopped.
    #[error("fence store unavailable: the journal is full and the fold thread has stopped")]
    FoldStopped,
    /// A delete of marks held the store longer than a raise or a read waits.
    #[error("fence store unavailable: a delete of fences has held the store for {0:?}; try again")]
    Deleting(Duration),
    /// The thread that makes raises durable has stopped.
    #[error("fence store unavailable: the commit thread has stopped")]
    CommitterStopped,
    /// Reading or writing a store file failed.
    #[error("fence store unavailable: {context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The store's own database (the file store's B-tree) could not be read.
    #[error("fence store unavailable: {context}: {source}")]
    Database {
        context: &'static str,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A store on the network (`store` names its kind, "Redis") refused or
    /// failed a call, or the connection to it is down.
    #[error("fence store unavailable: {context}: {message}")]
    Failed { store: &'static str, context: &'static str, message: String },
    /// A store on the network did not answer within `[fences] timeout`.
    #[error("fence store unavailable: {context}: {store} did not answer within {after:?}")]
    NoAnswer { store: &'static str, context: &'static str, after: Duration },
    /// Fewer of the store's replicas than `[fences] min_replicas`
    /// acknowledged the decision.
    #[error(
        "fence store unavailable: {acked} {store} replica(s) acknowledged the decision within {within:?}, \
         {wanted} required (min_replicas); nothing was forwarded"
    )]
    Replicas { store: &'static str, acked: i64, wanted: u32, within: Duration },
    /// The store lost marks, or is not the store this replica used: not
    /// trusted until an operator confirms it.
    #[error("fence store unavailable: {0}; an operator must confirm the store (fencegate fence confirm-store)")]
    Distrusted(Distrust),
    /// An operator confirmed the shared store (`store` names its kind)
    /// after it lost its data: writes admitted before the loss may still be
    /// in flight, with no record left, so fenced writes wait `left` more,
    /// until their leases have run out.
    #[error(
        "fence store unavailable: fenced writes are held for {} more: an operator confirmed the {store} fence store \
         after it lost its data, and writes admitted before that may still be in flight",
        humantime::format_duration(Duration::from_secs(.left.as_secs() + u64::from(.left.subsec_nanos() > 0)))
    )]
    Held { store: &'static str, left: Duration },
    /// The store answered something fencegate does not understand.
    #[error("fence store unavailable: {0}")]
    Unexpected(Unexpected),
    /// A blocking read of the store panicked or was cancelled.
    #[error("fence store unavailable: {context} failed: {source}")]
    Task {
        context: &'static str,
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
}

impl StoreError {
    /// When the same write may succeed, when the store knows: the
    /// `Retry-After` of its refusal (otherwise one second).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            StoreError::Held { left, .. } => Some(*left),
            _ => None,
        }
    }
}

/// Why a store replicas share is not trusted: what it answered that a
/// store which kept every mark could not have. `store` names the kind of
/// store ("Redis").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distrust {
    pub store: &'static str,
    pub doubt: Doubt,
}

/// What made a shared store untrusted ([`Distrust`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doubt {
    /// The identity this replica adopted is gone from the store: it was
    /// restarted without its data, flushed, or replaced.
    IdentityLost { was: String },
    /// The store carries another identity than the one this replica adopted.
    IdentityChanged { was: String, now: String },
    /// The store answered a mark below one this replica saw for `key`
    /// (`found: None`: no mark at all).
    MarkWentBack { key: String, found: Option<u64>, seen: u64 },
    /// The short form of [`MarkWentBack`](Doubt::MarkWentBack), as the
    /// refused request's problem says it.
    MarkLost { key: String },
    /// This replica is raising its remembered marks back into a store an
    /// operator confirmed through another replica.
    Restoring { identity: String },
    /// The identity changed again each time this replica read it.
    IdentityUnsettled,
    /// The store has no identity yet, and none could be adopted.
    NoIdentity,
    /// An identity written at first contact was gone when read back.
    IdentityVanished,
    /// etcd answered from another cluster than the one this replica
    /// adopted (ids in hex): the store was replaced.
    ClusterChanged { was: String, now: String },
    /// etcd answered at a revision below one this replica saw: it was
    /// restored from an older snapshot.
    RevisionWentBack { seen: i64, found: i64 },
    /// The store's count of deletions went back: it was restored from an
    /// older snapshot.
    DeletionsWentBack { seen: u64, found: u64 },
    /// The store no longer knows a lease this replica kept alive, before it
    /// could have ended: the records of its writes in flight are gone.
    LeaseLost { id: i64 },
}

impl std::fmt::Display for Distrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = self.store;
        match &self.doubt {
            Doubt::IdentityLost { was } => write!(
                f,
                "the {store} fence store lost its identity (was {was}): it was restarted without its data, \
                 flushed, or replaced, and its marks may have gone back"
            ),
            Doubt::IdentityChanged { was, now } => write!(
                f,
                "the {store} fence store's identity changed from {was} to {now}: it is not the store this replica used"
            ),
            Doubt::MarkWentBack { key, found, seen } => {
                let shown = found.map_or_else(|| "no mark".to_owned(), |m| format!("mark {m}"));
                write!(
                    f,
                    "the {store} fence store answered {shown} for key {key:?}, below the mark {seen} this replica \
                     saw: it lost writes (a restart without persistence, or a failover to a replica that missed them)"
                )
            }
            Doubt::MarkLost { key } => write!(f, "the {store} fence store lost the mark of {key:?}"),
            Doubt::Restoring { identity } => write!(
                f,
                "restoring this replica's marks into the {store} fence store, which an operator confirmed \
                 (identity {identity})"
            ),
            Doubt::IdentityUnsettled => write!(f, "the {store} fence store's identity keeps changing"),
            Doubt::ClusterChanged { was, now } => write!(
                f,
                "the {store} fence store answers from cluster {now}, not from cluster {was} this replica used: \
                 it was replaced, and its marks may have gone back"
            ),
            Doubt::DeletionsWentBack { seen, found } => write!(
                f,
                "the {store} fence store counts {found} deletions of marks, below the {seen} this replica saw: \
                 it was restored from an older snapshot, and its marks may have gone back"
            ),
            Doubt::LeaseLost { id } => write!(
                f,
                "the {store} fence store no longer knows lease {id:x}, which this replica kept alive: the records \
                 of its writes in flight went with it, as in a store that was replaced"
            ),
            Doubt::RevisionWentBack { seen, found } => write!(
                f,
                "the {store} fence store answered at revision {found}, below revision {seen} this replica saw: \
                 it was restored from an older snapshot, and its marks may have gone back"
            ),
            Doubt::NoIdentity => write!(f, "the {store} fence store has no identity yet"),
            Doubt::IdentityVanished => write!(f, "the {store} fence store's identity vanished as it was written"),
        }
    }
}

/// An answer of a store fencegate does not understand: `store` names the
/// kind of store ("Redis"), `found` what it answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {store} fence store answered {found}")]
pub struct Unexpected {
    pub store: &'static str,
    pub found: Found,
}

/// What an [`Unexpected`] answer held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Found {
    /// Nothing at all, not even a verdict.
    #[error("an empty answer")]
    Empty,
    /// A mark that is no base-10 token.
    #[error("a mark that is not a token ({0:?})")]
    Mark(String),
    /// A count that is no base-10 number.
    #[error("a count that is not a number ({0:?})")]
    Count(String),
    /// A duration that is no whole number of milliseconds (missing: empty).
    #[error("a duration that is not a number of milliseconds ({0:?})")]
    Milliseconds(String),
    /// A verdict the call never gives.
    #[error("{0}")]
    Verdict(String),
    /// A lease record that is not one.
    #[error("a lease record that is not one ({0})")]
    Lease(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Operators and tests read these texts (`/readyz`, problem details,
    /// the ERROR line): the words stay what they were when they were strings.
    #[test]
    fn distrust_says_what_was_found_in_the_words_it_always_had() {
        let redis = |doubt| StoreError::Distrusted(Distrust { store: "Redis", doubt }).to_string();
        assert_eq!(
            redis(Doubt::MarkLost { key: "/a".into() }),
            "fence store unavailable: the Redis fence store lost the mark of \"/a\"; an operator must confirm the \
             store (fencegate fence confirm-store)"
        );
        let back = Distrust { store: "Redis", doubt: Doubt::MarkWentBack { key: "/a".into(), found: None, seen: 7 } };
        assert!(back
            .to_string()
            .starts_with("the Redis fence store answered no mark for key \"/a\", below the mark 7"));
        let back =
            Distrust { store: "Redis", doubt: Doubt::MarkWentBack { key: "/a".into(), found: Some(3), seen: 7 } };
        assert!(back.to_string().contains("answered mark 3 for key"), "{back}");
        let changed = Distrust { store: "Redis", doubt: Doubt::IdentityChanged { was: "a".into(), now: "b".into() } };
        assert!(changed.to_string().contains("identity changed from a to b"), "{changed}");
    }

    #[test]
    fn an_unexpected_answer_names_what_it_held() {
        let found = |found| StoreError::Unexpected(Unexpected { store: "Redis", found }).to_string();
        assert_eq!(
            found(Found::Verdict("maybe".into())),
            "fence store unavailable: the Redis fence store answered maybe"
        );
        assert_eq!(found(Found::Empty), "fence store unavailable: the Redis fence store answered an empty answer");
        assert!(found(Found::Mark("12x".into())).ends_with("a mark that is not a token (\"12x\")"));
    }

    #[test]
    fn a_hold_is_shown_in_whole_seconds_rounded_up() {
        let held = StoreError::Held { store: "Redis", left: Duration::from_millis(1500) };
        assert!(held.to_string().contains("held for 2s more"), "{held}");
        assert_eq!(held.retry_after(), Some(Duration::from_millis(1500)));
        assert_eq!(StoreError::Closing.retry_after(), None);
    }
}
