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
//! and the last record's token), then raises the mark to that token, moving
//! its record's token up while the mark is ahead of it. Only then is the
//! token answered. A process killed in between leaves a record whose token
//! was never answered: the record runs out, and the next holder gets a
//! higher one. The lease is advice: a holder paused past its lease may still
//! send a write, and the fence refuses it once a newer holder's token raised
//! the mark.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fence::store::{Advance, FenceStore, LeaseRecord, StoreError};

/// How often a lease's record may be found changed under one call before
/// it gives up (503): only callers racing on one key change it.
const MAX_ROUNDS: usize = 64;
/// How long an acquisition that waits sleeps between looks at a held lease.
const WAIT_STEP: Duration = Duration::from_millis(50);

/// Why a lease call failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The store could not be read or changed.
    #[error(transparent)]
    Store(#[from] StoreError),
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

/// Gives `key`'s lease to `holder` for `ttl`, with a token above every token
/// issued or seen for the key; the mark is raised to it before this returns.
/// A lease held by another (or by the same holder name: an acquisition
/// never renews) is waited for up to `wait`, then answered as
/// [`Acquired::Held`].
pub async fn acquire<St: FenceStore + ?Sized>(
    store: &St,
    key: &str,
    holder: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Acquired, LeaseError> {
    let deadline = tokio::time::Instant::now() + wait;
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
            // Waiting is not racing: a held lease does not use up the attempts.
            rounds -= 1;
            continue;
        }
        let mark = store.get(key).await?;
        let floor = mark.max(found.as_ref().map(|r| r.token));
        let token = next(floor)?;
        let mut record = LeaseRecord { token, holder: holder.to_owned(), expires_ms: expiry(now, ttl) };
        if !store.swap_lease(key, found.as_ref(), Some(&record)).await? {
            continue;
        }
        // The record is ours: raise the mark to its token, strictly.
        loop {
            let ahead = match store.advance(key, record.token).await? {
                Advance::Accepted { previous } if previous.is_none_or(|p| p < record.token) => {
                    return Ok(Acquired::Granted(record));
                }
                // A write carrying this very token came first: it was seen.
                Advance::Accepted { .. } => record.token,
                Advance::Stale { current } => current,
            };
            let moved = LeaseRecord { token: next(Some(ahead))?, ..record.clone() };
            if !store.swap_lease(key, Some(&record), Some(&moved)).await? {
                // Taken over (it ran out meanwhile): start again.
                break;
            }
            record = moved;
        }
    }
}

fn next(floor: Option<u64>) -> Result<u64, LeaseError> {
    match floor {
        None => Ok(1),
        Some(t) => t.checked_add(1).ok_or(LeaseError::Exhausted),
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
    use crate::fence::store::MemoryStore;

    const TTL: Duration = Duration::from_secs(30);

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
        let lease = granted(acquire(&store, "/k", "a", TTL, Duration::ZERO).await.unwrap());
        assert_eq!((lease.token, lease.holder.as_str()), (42, "a"));
        assert_eq!(store.get("/k").await.unwrap(), Some(42));
        assert_eq!(store.advance("/k", 41).await.unwrap(), Advance::Stale { current: 42 });
        let first = granted(acquire(&store, "/fresh", "a", TTL, Duration::ZERO).await.unwrap());
        assert_eq!(first.token, 1, "a key with no mark starts at 1");
    }

    #[tokio::test]
    async fn a_held_lease_is_answered_with_its_holder_and_never_renewed_by_acquiring() {
        let store = MemoryStore::default();
        let a = granted(acquire(&store, "/k", "a", TTL, Duration::ZERO).await.unwrap());
        for holder in ["b", "a"] {
            assert_eq!(acquire(&store, "/k", holder, TTL, Duration::ZERO).await.unwrap(), Acquired::Held(a.clone()));
        }
        assert_eq!(store.get("/k").await.unwrap(), Some(a.token), "a refused acquisition raises nothing");
    }

    #[tokio::test]
    async fn a_lease_that_ran_out_is_taken_over_with_a_higher_token_and_its_holder_loses_it() {
        let store = MemoryStore::default();
        let a = granted(acquire(&store, "/k", "a", Duration::from_millis(30), Duration::ZERO).await.unwrap());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(renew(&store, "/k", a.token, TTL).await.unwrap(), Held::No(Some(a.clone())), "ran out: not renewed");
        let b = granted(acquire(&store, "/k", "b", TTL, Duration::ZERO).await.unwrap());
        assert_eq!(b.token, a.token + 1);
        assert_eq!(release(&store, "/k", a.token).await.unwrap(), Held::No(Some(b.clone())));
        assert_eq!(store.advance("/k", a.token).await.unwrap(), Advance::Stale { current: b.token });
    }

    #[tokio::test]
    async fn a_waiting_acquisition_gets_the_lease_once_it_is_released() {
        let store = std::sync::Arc::new(MemoryStore::default());
        let a = granted(acquire(&*store, "/k", "a", TTL, Duration::ZERO).await.unwrap());
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { acquire(&*store, "/k", "b", TTL, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(release(&*store, "/k", a.token).await.unwrap(), Held::Yes(a.clone()));
        let b = granted(waiter.await.unwrap().unwrap());
        assert_eq!((b.holder.as_str(), b.token), ("b", a.token + 1));
    }

    #[tokio::test]
    async fn renewing_lengthens_only_the_holders_lease() {
        let store = MemoryStore::default();
        let a = granted(acquire(&store, "/k", "a", Duration::from_secs(1), Duration::ZERO).await.unwrap());
        let Held::Yes(renewed) = renew(&store, "/k", a.token, TTL).await.unwrap() else { panic!("not renewed") };
        assert!(renewed.expires_ms >= a.expires_ms + 28_000, "{renewed:?} after {a:?}");
        assert_eq!(renew(&store, "/k", a.token + 1, TTL).await.unwrap(), Held::No(Some(renewed.clone())));
        assert_eq!(renew(&store, "/none", 1, TTL).await.unwrap(), Held::No(None));
    }

    #[tokio::test]
    async fn a_token_a_write_brought_is_never_issued() {
        let store = MemoryStore::default();
        let a = granted(acquire(&store, "/k", "a", TTL, Duration::ZERO).await.unwrap());
        assert_eq!(release(&store, "/k", a.token).await.unwrap(), Held::Yes(a.clone()));
        // A write with a token from elsewhere raised the mark past it.
        store.advance("/k", 5).await.unwrap();
        let b = granted(acquire(&store, "/k", "b", TTL, Duration::ZERO).await.unwrap());
        assert_eq!(b.token, 6);
    }

    #[tokio::test]
    async fn concurrent_acquisitions_of_one_key_are_granted_one_at_a_time_with_rising_tokens() {
        let store = std::sync::Arc::new(MemoryStore::default());
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let holder = format!("w{i}");
                let lease = granted(acquire(&*store, "/k", &holder, TTL, Duration::from_secs(10)).await.unwrap());
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
