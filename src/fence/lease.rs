//! Leases whose acquisition fences the last holder: the token comes from the
//! key's own mark, raised to it before the holder hears of it.
//!
//! Built on two atomic steps every store has, for every store alike:
//!
//! - the lease record's compare-and-swap
//!   ([`FenceStore::swap_lease`]): one holder at a time;
//! - the mark's compare-and-raise ([`FenceStore::advance`]), which answers the
//!   mark it found. A token is issued only when the mark found was below it,
//!   so no two acquisitions (on one replica or several) and no write that
//!   came with its own token ever share a token: the token is above every
//!   token issued or seen for the key.
//!
//! An acquisition first takes the record (with a token one above the mark
//! and the last record's token), then raises the mark to that token under
//! the key's turn (so the writes of the key in flight end first, and the new
//! holder reads what they wrote), moving its record's token up while the
//! mark is ahead of it. Only then is the token answered; if the raise
//! fails, the record is put back. A process killed in between leaves a record whose token
//! was never answered: the record runs out, and the next holder gets a
//! higher one. The lease is advice: a holder paused past its lease may still
//! send a write, and the fence refuses it once a newer holder's token raised
//! the mark.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use crate::fence::gate::{Ask, NoTurn};
use crate::fence::store::{Entered, FenceStore, LeaseRecord, StoreError};
use crate::fence::KeyGate;

/// How often a lease's record may be found changed under one call before
/// it gives up (503): only callers racing on one key change it.
const MAX_ROUNDS: usize = 64;
/// How long an acquisition waits for the writes of its key in flight to end
/// (the key's turn), as a fenced write waits with a route's default
/// `queue_timeout`.
pub const TURN_WAIT: Duration = Duration::from_secs(10);
/// How long an acquisition that waits sleeps between looks at a held lease.
const WAIT_STEP: Duration = Duration::from_millis(50);

/// Why a lease call failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The store could not be read or changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The writes of the key in flight did not end within [`TURN_WAIT`].
    #[error(
        "the writes of this key in flight did not end within {}; try again",
        humantime::format_duration(TURN_WAIT)
    )]
    Busy,
    /// The key's lease record changed under every attempt.
    #[error("the lease of this key kept changing under the call ({MAX_ROUNDS} attempts); try again")]
    Contended,
    /// The key's mark is the largest token there is.
    #[error("the key's mark is {}, the largest token: no higher token can be issued", u64::MAX)]
    Exhausted,
}

/// What [`acquire`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is the caller's, with `token`: the key's mark is that token now.
    Granted(LeaseRecord),
    /// Another holder's lease had not run out by the end of the wait.
    Held(LeaseRecord),
}

/// What [`renew`] or [`release`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// The caller holds the lease: renewed (the new record) or released (the old one).
    Yes(LeaseRecord),
    /// The caller does not hold it (any more): the key's record now, if it
    /// has one. A lease that ran out is not the caller's, even when nobody
    /// has taken it since.
    No(Option<LeaseRecord>),
}

/// Milliseconds since the Unix epoch, by this replica's clock.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Whether `record` is still held at `now` (milliseconds since the epoch).
pub fn is_held(record: &LeaseRecord, now: u64) -> bool {
    record.expires_ms > now
}

fn expiry(now: u64, ttl: Duration) -> u64 {
    now.saturating_add(ttl.as_millis() as u64)
}

/// What an acquisition asks for.
#[derive(Debug, Clone)]
pub struct Asked {
    /// Who takes it.
    pub holder: String,
    /// How long it lasts unless renewed.
    pub ttl: Duration,
    /// How long to wait for a lease another holds.
    pub wait: Duration,
    /// For keys written through a `strict` route (one write per token, a
    /// token equal to the mark refused): the mark is raised to one below the
    /// token issued, so the holder's first write is above it.
    pub strict: bool,
}

/// Gives `key`'s lease to `asked.holder` for `asked.ttl`, with a token above
/// every token issued or seen for the key; the mark is raised to it (to one
/// below it, for `strict`) under the key's turn before this returns, so the
/// writes of the key admitted before have ended: what the holder reads next
/// has them. A lease held by another (or by the same holder name: an
/// acquisition never renews) is waited for up to `asked.wait`, then answered
/// as [`Acquired::Held`].
pub async fn acquire<St: FenceStore + ?Sized>(
    store: &St,
    gate: &Arc<KeyGate>,
    key: &str,
    asked: &Asked,
) -> Result<Acquired, LeaseError> {
    let deadline = tokio::time::Instant::now() + asked.wait;
    let mut rounds = 0;
    loop {
        rounds += 1;
        if rounds > MAX_ROUNDS {
            return Err(LeaseError::Contended);
        }
        let found = store.lease(key).await?;
        let now = now_ms();
        if let Some(held) = found.as_ref().filter(|r| is_held(r, now)) {
            let left = tokio::time::Instant::now();
            if left >= deadline {
                return Ok(Acquired::Held(held.clone()));
            }
            let until_expiry = Duration::from_millis(held.expires_ms - now);
            tokio::time::sleep(WAIT_STEP.min(until_expiry).min(deadline - left)).await;
            // Another's lease was there: whatever raced before, start counting again.
            rounds = 0;
            continue;
        }
        let mark = store.get(key).await?;
        let floor = mark.max(found.as_ref().map(|r| r.token));
        let token = next(floor, asked.strict)?;
        let record = LeaseRecord { token, holder: asked.holder.clone(), expires_ms: expiry(now, asked.ttl) };
        if !store.swap_lease(key, found.as_ref(), Some(&record)).await? {
            continue;
        }
        // The record is ours: raise the mark under the key's turn. Should
        // that fail, the record goes back to what it was, so nobody finds a
        // lease that was never granted.
        match raise(store, gate, key, record, asked.strict).await {
            Ok(Some(granted)) => return Ok(Acquired::Granted(granted)),
            // Taken over meanwhile (it ran out): start again.
            Ok(None) => continue,
            Err((error, ours)) => {
                let _ = store.swap_lease(key, Some(&ours), found.as_ref()).await;
                return Err(error);
            }
        }
    }
}

/// The raise of an acquisition whose record is `record`: the key's turn,
/// alone (the writes of the key in flight here end first; a store replicas
/// share also waits for theirs on other replicas), then the mark raised
/// strictly. While the mark is found at or above the raise (a write came
/// with a token of its own), the record's token moves above it. `None`: the
/// record was taken over meanwhile; on an error, the record as it is now.
async fn raise<St: FenceStore + ?Sized>(
    store: &St,
    gate: &Arc<KeyGate>,
    key: &str,
    mut record: LeaseRecord,
    strict: bool,
) -> Result<Option<LeaseRecord>, (LeaseError, LeaseRecord)> {
    let shared_key: Arc<str> = key.into();
    loop {
        let target = if strict { record.token - 1 } else { record.token };
        let ahead = match gate.acquire(&shared_key, target, Ask::Alone, TURN_WAIT).await {
            Ok(turn) => {
                let entered = store.enter(key, target, Ask::Alone, TURN_WAIT, TURN_WAIT).await;
                let ahead = match entered {
                    Ok(Entered::Accepted { previous, .. }) if previous.is_none_or(|p| p < target) => None,
                    // A write carrying this very token came first: it was seen.
                    Ok(Entered::Accepted { .. }) => Some(target),
                    Ok(Entered::Stale { current }) => Some(current),
                    Ok(Entered::Superseded { waiting }) => Some(waiting),
                    Ok(Entered::TimedOut) => return Err((LeaseError::Busy, record)),
                    Err(e) => return Err((e.into(), record)),
                };
                // The record of this raise in the store ends before the turn
                // passes on: the next write of the key finds neither.
                drop(entered);
                drop(turn);
                match ahead {
                    None => return Ok(Some(record)),
                    Some(ahead) => ahead,
                }
            }
            Err(NoTurn::Stale { current }) => current,
            Err(NoTurn::Superseded { waiting }) => waiting,
            Err(NoTurn::Timeout) => return Err((LeaseError::Busy, record)),
        };
        let token = match next(Some(ahead), strict) {
            Ok(token) => token,
            Err(e) => return Err((e, record)),
        };
        let moved = LeaseRecord { token, ..record.clone() };
        match store.swap_lease(key, Some(&record), Some(&moved)).await {
            Ok(true) => record = moved,
            Ok(false) => return Ok(None),
            Err(e) => return Err((e.into(), record)),
        }
    }
}

/// The token after `floor` (the first one, 1, after none); for `strict`,
/// one more, so the mark can be raised to the token before it.
fn next(floor: Option<u64>, strict: bool) -> Result<u64, LeaseError> {
    let step = if strict { 2 } else { 1 };
    match floor {
        None => Ok(step),
        Some(t) => t.checked_add(step).ok_or(LeaseError::Exhausted),
    }
}

/// Lengthens the lease of `key` held with `token` to `ttl` from now.
pub async fn renew<St: FenceStore + ?Sized>(
    store: &St,
    key: &str,
    token: u64,
    ttl: Duration,
) -> Result<Held, LeaseError> {
    change(store, key, token, |record, now| Some(LeaseRecord { expires_ms: expiry(now, ttl), ..record.clone() })).await
}

/// Ends the lease of `key` held with `token`; the key's mark stays.
pub async fn release<St: FenceStore + ?Sized>(store: &St, key: &str, token: u64) -> Result<Held, LeaseError> {
    change(store, key, token, |_, _| None).await
}

/// Replaces the record of the lease held with `token` by what `to` makes of
/// it, if the caller holds it.
async fn change<St: FenceStore + ?Sized>(
    store: &St,
    key: &str,
    token: u64,
    to: impl Fn(&LeaseRecord, u64) -> Option<LeaseRecord>,
) -> Result<Held, LeaseError> {
    for _ in 0..MAX_ROUNDS {
        let now = now_ms();
        let record = match store.lease(key).await? {
            Some(record) if record.token == token && is_held(&record, now) => record,
            other => return Ok(Held::No(other)),
        };
        let new = to(&record, now);
        if store.swap_lease(key, Some(&record), new.as_ref()).await? {
            return Ok(Held::Yes(new.unwrap_or(record)));
        }
    }
    Err(LeaseError::Contended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::store::{Advance, MemoryStore};

    const TTL: Duration = Duration::from_secs(30);

    fn asked(holder: &str, ttl: Duration, wait: Duration) -> Asked {
        Asked { holder: holder.into(), ttl, wait, strict: false }
    }

    /// A lease of `key` for `holder` on `store`, through a gate of its own.
    async fn take(store: &MemoryStore, key: &str, holder: &str, ttl: Duration, wait: Duration) -> Acquired {
        acquire(store, &Arc::new(KeyGate::default()), key, &asked(holder, ttl, wait)).await.unwrap()
    }

    fn granted(a: Acquired) -> LeaseRecord {
        match a {
            Acquired::Granted(r) => r,
            Acquired::Held(r) => panic!("held by {r:?}"),
        }
    }

    #[tokio::test]
    async fn a_lease_takes_a_token_above_the_mark_and_raises_the_mark_to_it() {
        let store = MemoryStore::default();
        store.advance("/k", 41).await.unwrap();
        let lease = granted(take(&store, "/k", "a", TTL, Duration::ZERO).await);
        assert_eq!((lease.token, lease.holder.as_str()), (42, "a"));
        assert_eq!(store.get("/k").await.unwrap(), Some(42));
        assert_eq!(store.advance("/k", 41).await.unwrap(), Advance::Stale { current: 42 });
        let first = granted(take(&store, "/fresh", "a", TTL, Duration::ZERO).await);
        assert_eq!(first.token, 1, "a key with no mark starts at 1");
    }

    #[tokio::test]
    async fn a_strict_lease_leaves_the_mark_one_below_its_token() {
        let store = MemoryStore::default();
        store.advance("/k", 41).await.unwrap();
        let strict = Asked { strict: true, ..asked("a", TTL, Duration::ZERO) };
        let lease = granted(acquire(&store, &Arc::new(KeyGate::default()), "/k", &strict).await.unwrap());
        assert_eq!(lease.token, 43);
        assert_eq!(store.get("/k").await.unwrap(), Some(42), "every older token is refused, the holder's is above");
    }

    #[tokio::test]
    async fn a_held_lease_is_answered_with_its_holder_and_never_renewed_by_acquiring() {
        let store = MemoryStore::default();
        let a = granted(take(&store, "/k", "a", TTL, Duration::ZERO).await);
        for holder in ["b", "a"] {
            assert_eq!(take(&store, "/k", holder, TTL, Duration::ZERO).await, Acquired::Held(a.clone()));
        }
        assert_eq!(store.get("/k").await.unwrap(), Some(a.token), "a refused acquisition raises nothing");
    }

    #[tokio::test]
    async fn a_lease_that_ran_out_is_taken_over_with_a_higher_token_and_its_holder_loses_it() {
        let store = MemoryStore::default();
        let a = granted(take(&store, "/k", "a", Duration::from_millis(30), Duration::ZERO).await);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(renew(&store, "/k", a.token, TTL).await.unwrap(), Held::No(Some(a.clone())), "ran out: not renewed");
        let b = granted(take(&store, "/k", "b", TTL, Duration::ZERO).await);
        assert_eq!(b.token, a.token + 1);
        assert_eq!(release(&store, "/k", a.token).await.unwrap(), Held::No(Some(b.clone())));
        assert_eq!(store.advance("/k", a.token).await.unwrap(), Advance::Stale { current: b.token });
    }

    #[tokio::test]
    async fn a_waiting_acquisition_gets_the_lease_once_it_is_released() {
        let store = Arc::new(MemoryStore::default());
        let a = granted(take(&store, "/k", "a", TTL, Duration::ZERO).await);
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { take(&store, "/k", "b", TTL, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(release(&*store, "/k", a.token).await.unwrap(), Held::Yes(a.clone()));
        let b = granted(waiter.await.unwrap());
        assert_eq!((b.holder.as_str(), b.token), ("b", a.token + 1));
    }

    #[tokio::test]
    async fn renewing_lengthens_only_the_holders_lease() {
        let store = MemoryStore::default();
        let a = granted(take(&store, "/k", "a", Duration::from_secs(1), Duration::ZERO).await);
        let Held::Yes(renewed) = renew(&store, "/k", a.token, TTL).await.unwrap() else { panic!("not renewed") };
        assert!(renewed.expires_ms >= a.expires_ms + 28_000, "{renewed:?} after {a:?}");
        assert_eq!(renew(&store, "/k", a.token + 1, TTL).await.unwrap(), Held::No(Some(renewed.clone())));
        assert_eq!(renew(&store, "/none", 1, TTL).await.unwrap(), Held::No(None));
    }

    #[tokio::test]
    async fn a_token_a_write_brought_is_never_issued() {
        let store = MemoryStore::default();
        let a = granted(take(&store, "/k", "a", TTL, Duration::ZERO).await);
        assert_eq!(release(&store, "/k", a.token).await.unwrap(), Held::Yes(a.clone()));
        // A write with a token from elsewhere raised the mark past it.
        store.advance("/k", 5).await.unwrap();
        let b = granted(take(&store, "/k", "b", TTL, Duration::ZERO).await);
        assert_eq!(b.token, 6);
    }

    /// The acquisition takes the key's turn: a write of the key in flight
    /// (holding its turn) ends first, so the new holder reads what it wrote.
    /// And while it waits, a write that arrives with a token of its own above
    /// the record's moves the lease's token above it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquisition_waits_for_the_write_in_flight_and_goes_above_what_it_brought() {
        let store = Arc::new(MemoryStore::default());
        let gate = Arc::new(KeyGate::default());
        store.advance("/k", 5).await.unwrap();
        let key: Arc<str> = "/k".into();
        let in_flight = gate.acquire(&key, 5, Ask::Share, TTL).await.unwrap();
        let acquisition = {
            let (store, gate) = (store.clone(), gate.clone());
            tokio::spawn(async move { acquire(&*store, &gate, "/k", &asked("b", TTL, Duration::ZERO)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!acquisition.is_finished(), "the acquisition did not wait for the write in flight");
        let waiting = store.lease("/k").await.unwrap().expect("the record is taken first");
        assert_eq!(waiting.token, 6);
        // The write in flight raised the mark past the record's token as it ended.
        store.advance("/k", 9).await.unwrap();
        drop(in_flight);
        let lease = granted(acquisition.await.unwrap().unwrap());
        assert_eq!(lease.token, 10);
        assert_eq!(store.get("/k").await.unwrap(), Some(10));
        assert_eq!(store.lease("/k").await.unwrap(), Some(lease));
    }

    /// A raise that cannot happen (the writes in flight never end) gives the
    /// record back: nobody finds a lease that was never granted.
    #[tokio::test(start_paused = true)]
    async fn a_failed_acquisition_leaves_no_lease() {
        let store = MemoryStore::default();
        let gate = Arc::new(KeyGate::default());
        let key: Arc<str> = "/k".into();
        let _stuck = gate.acquire(&key, 1, Ask::Alone, TTL).await.unwrap();
        let error = acquire(&store, &gate, "/k", &asked("b", TTL, Duration::ZERO)).await.unwrap_err();
        assert!(matches!(error, LeaseError::Busy), "{error:?}");
        assert_eq!(store.lease("/k").await.unwrap(), None);
        assert_eq!(store.get("/k").await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_acquisitions_of_one_key_are_granted_one_at_a_time_with_rising_tokens() {
        let store = Arc::new(MemoryStore::default());
        let gate = Arc::new(KeyGate::default());
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (store, gate) = (store.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                let wanted = asked(&format!("w{i}"), TTL, Duration::from_secs(10));
                let lease = granted(acquire(&*store, &gate, "/k", &wanted).await.unwrap());
                assert_eq!(store.get("/k").await.unwrap(), Some(lease.token), "the mark is the holder's token");
                tokio::task::yield_now().await;
                assert_eq!(release(&*store, "/k", lease.token).await.unwrap(), Held::Yes(lease.clone()));
                lease.token
            }));
        }
        let mut tokens = Vec::new();
        for t in tasks {
            tokens.push(t.await.unwrap());
        }
        tokens.sort_unstable();
        assert_eq!(tokens, (1..=16).collect::<Vec<_>>(), "each token issued once");
    }
}
