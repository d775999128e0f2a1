//! Shared fences: marks in Redis, for replicas of fencegate in front of the
//! same data (`[fences] store = "redis"`).
//!
//! Every decision is one Lua script run server-side (`scripts.lua`,
//! `scripts.rs`): the compare-and-raise and, for a fenced write, the record of
//! the write in flight that other replicas' raises wait for (invariant 2
//! across replicas). A replica's own turns ([`crate::fence::KeyGate`]) still
//! order its requests; the store orders the replicas.
//!
//! In Redis, under `key_prefix` (`P`; see `names.rs`):
//! - `P mark:<key>`: the mark, a base-10 string;
//! - `P flight:<key>`: a sorted set of the writes of the key in flight on any
//!   replica, each scored with the Redis server time its lease ends (the
//!   lease its route gives it, plus a margin): a replica that dies mid-write
//!   leaves entries that expire (`flight.rs`);
//! - `P wait:<key>`: the highest token waiting to raise the key, for as long
//!   as it waits, so the old holder's writes are refused meanwhile;
//! - `P shared:<key>`: the token the writes in flight carry: only writes
//!   with that token join them;
//! - `P keys`: every key with a mark, for listings and prefix deletes;
//! - `P identity`: the store's identity (`id`, `previous`, `deletions`),
//!   written at first use (`identity.rs`). A Redis that lost it, or that
//!   answers with a mark below one this replica saw, is not trusted until
//!   an operator confirms it (`health.rs`).
//!
//! Anything that keeps a call from answering within `timeout` (Redis down,
//! slow, a replica not acknowledging) refuses the write: 503, nothing
//! forwarded. The connection reconnects on its own with backoff.

mod flight;
mod health;
mod identity;
mod names;
mod scripts;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use super::{
    Advance, AtHand, CallStats, Confirmed, Deleted, Distrust, Doubt, Entered, FenceStore, Found, InFlight, LeaseRecord,
    Selection, StoreError, Unexpected,
};
use crate::config::RedisConfig;
use crate::fence::gate::Ask;
use crate::fence::store::knowledge::{new_identity, Knowledge};
use flight::{end_records, Flight, Flights, Record};
use health::{health, Reachability};
use names::{lex_inclusive, upper_bound, Names};
use scripts::{millis, parse_count, parse_mark, Scripts, Verdict};

/// How this store names itself in what it reports.
const STORE: &str = "Redis";

/// Keys a prefix delete drops per script call: each call holds Redis alone.
const DELETE_BATCH: usize = 1000;

fn unexpected(found: Found) -> StoreError {
    StoreError::Unexpected(Unexpected { store: STORE, found })
}

fn distrusted(doubt: Doubt) -> StoreError {
    StoreError::Distrusted(Distrust { store: STORE, doubt })
}

fn failed(context: &'static str, e: redis::RedisError) -> StoreError {
    StoreError::Failed { store: STORE, context, message: e.to_string() }
}

/// Marks in Redis, shared by every fencegate that uses the same server and
/// `key_prefix`. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.inner.names.prefix()).finish_non_exhaustive()
    }
}

struct Inner {
    con: ConnectionManager,
    names: Names,
    scripts: Scripts,
    timeout: Duration,
    min_replicas: u32,
    replica_timeout: Duration,
    /// The store's identity as this replica knows it, and the marks it saw.
    knowledge: Knowledge,
    /// Identity changes (adoption, restore, an operator's confirmation) one
    /// at a time.
    transition: tokio::sync::Mutex<()>,
    reachable: Reachability,
    /// Keys with a mark in the store, as last counted.
    tracked: AtomicUsize,
    /// This replica's writes in flight.
    flights: Flights,
    /// Round trips, reconnects and trust, for `/metrics`.
    calls: Arc<CallStats>,
}

impl RedisStore {
    /// Connects lazily (fencegate starts, unready, while Redis is down) and
    /// starts the health check on the current runtime.
    pub fn open(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        let client = match &config.ca_file {
            None => redis::Client::open(config.url.as_str()),
            Some(path) => {
                let roots = std::fs::read(path).map_err(|e| StoreError::Io {
                    context: "reading [fences] ca_file",
                    source: Arc::new(std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
                })?;
                let certificates = redis::TlsCertificates { client_tls: None, root_cert: Some(roots) };
                redis::Client::build_with_tls(config.url.as_str(), certificates)
            }
        }
        .map_err(|e| failed("opening the Redis client", e))?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout + config.replica_timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_secs(2))
            .set_number_of_retries(usize::MAX);
        let con = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| failed("opening the Redis connection", e))?;
        let (flights, ended) = Flights::new(new_identity()?);
        let calls = Arc::new(CallStats::new("redis"));
        let inner = Arc::new(Inner {
            con,
            names: Names::new(&config.key_prefix),
            scripts: Scripts::load(),
            timeout: config.timeout,
            min_replicas: config.min_replicas,
            replica_timeout: config.replica_timeout,
            knowledge: Knowledge::new(config.cache_keys, calls.clone()),
            transition: tokio::sync::Mutex::new(()),
            reachable: Reachability::default(),
            tracked: AtomicUsize::new(0),
            flights,
            calls,
        });
        tokio::spawn(health(Arc::downgrade(&inner)));
        tokio::spawn(end_records(Arc::downgrade(&inner), ended));
        Ok(RedisStore { inner })
    }
}

/// How long a lease record stays in Redis after its lease ends.
const LEASE_KEPT_MS: u64 = 3_600_000;

impl FenceStore for RedisStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let inner = &self.inner;
        let before = inner.knowledge.before(key);
        let reply = inner.run_bytes(&inner.scripts.get, &[inner.names.mark(key), inner.names.identity()], &[]).await?;
        let mark = reply.mark()?;
        inner.observe(key, mark, before, &reply)?;
        Ok(mark)
    }

    /// The mark this replica last saw for `key`: a token below it is stale
    /// whatever the store says now.
    fn at_hand(&self, key: &str) -> AtHand {
        AtHand::Floor(self.inner.knowledge.seen(key))
    }

    /// The fence API's raise: compare-and-raise, no turn.
    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        let inner = &self.inner;
        let keys = [inner.names.mark(key), inner.names.index(), inner.names.identity()];
        let before = inner.knowledge.before(key);
        let (reply, acked) =
            inner.run_waiting(&inner.scripts.raise, &keys, &[token.to_string(), key.to_owned()]).await?;
        let mark = reply.mark()?;
        inner.observe(key, mark, before, &reply)?;
        match reply.verdict {
            Verdict::Ok => {
                inner.knowledge.remember(key, token, reply.deletions);
                // An operator's raise shuts out an old holder only once the
                // replicas asked for have it, as a write's does.
                inner.replicas_acked(acked)?;
                Ok(Advance::Accepted { previous: mark })
            }
            Verdict::Stale => Ok(Advance::Stale { current: mark.unwrap_or_default() }),
            other => Err(other.unexpected()),
        }
    }

    async fn lease(&self, key: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let inner = &self.inner;
        let reply =
            inner.run_bytes(&inner.scripts.lease, &[inner.names.lease(key), inner.names.identity()], &[]).await?;
        match reply.verdict {
            Verdict::Ok => match reply.rest.first().map(String::as_str) {
                None | Some("") => Ok(None),
                Some(text) => LeaseRecord::decode(STORE, text.as_bytes()).map(Some),
            },
            other => Err(other.unexpected()),
        }
    }

    /// Compared whole, as JSON: a record is written once and read back as
    /// it was, so it encodes to the same text.
    async fn swap_lease(
        &self,
        key: &str,
        expected: Option<&LeaseRecord>,
        new: Option<&LeaseRecord>,
    ) -> Result<bool, StoreError> {
        let inner = &self.inner;
        let keys = [inner.names.lease(key), inner.names.identity()];
        let keep = new.map_or(0, |r| r.expires_ms.saturating_sub(crate::fence::lease::now_ms())) + LEASE_KEPT_MS;
        let args = [
            expected.map(LeaseRecord::encode).unwrap_or_default(),
            new.map(LeaseRecord::encode).unwrap_or_default(),
            keep.to_string(),
        ];
        let (reply, acked) = inner.run_waiting(&inner.scripts.swap_lease, &keys, &args).await?;
        match reply.verdict {
            Verdict::Ok => {
                // A record a failover could lose would let two hold the lease.
                inner.replicas_acked(acked)?;
                Ok(true)
            }
            Verdict::Busy => Ok(false),
            other => Err(other.unexpected()),
        }
    }

    /// A fenced write's turn of `key` across replicas: its mark raised (or
    /// shared) and the write recorded in flight until the returned
    /// [`InFlight`] is dropped, or its lease ends. Waits up to `wait` while
    /// other replicas' writes of the key are in flight.
    async fn enter(
        &self,
        key: &str,
        token: u64,
        ask: Ask,
        lease: Duration,
        wait: Duration,
    ) -> Result<Entered, StoreError> {
        let inner = &self.inner;
        let deadline = Instant::now() + wait;
        let record = Record { flight: inner.names.flight(key), member: inner.flights.next_member() };
        let keys = [
            inner.names.mark(key),
            record.flight.clone(),
            inner.names.wait(key),
            inner.names.index(),
            inner.names.identity(),
            inner.names.shared(key),
        ];
        // The decision's answer may wait for the replicas first.
        let replica_wait = if inner.min_replicas > 0 { inner.replica_timeout } else { Duration::ZERO };
        let lease_ms = millis(inner.flights.give(lease, replica_wait)).to_string();
        let alone = if ask == Ask::Alone { "1" } else { "0" };
        let mut pause = Duration::from_millis(1);
        loop {
            let wait_ms = millis(deadline.saturating_duration_since(Instant::now())).to_string();
            let before = inner.knowledge.before(key);
            let args =
                [token.to_string(), record.member.clone(), lease_ms.clone(), alone.into(), wait_ms, key.to_owned()];
            let (reply, acked) = match inner.run_waiting(&inner.scripts.enter, &keys, &args).await {
                Ok(answer) => answer,
                Err(e) => {
                    // The script may have run before the answer was lost: its
                    // record, if any, must not hold the key for its whole
                    // lease. (Ending a record that is not there does nothing.)
                    inner.flights.end(record);
                    return Err(e);
                }
            };
            match reply.verdict {
                Verdict::Ok => {
                    // Ends the record on any way out from here.
                    let in_flight = InFlight::recorded(Flight { inner: self.inner.clone(), record });
                    let previous = reply.mark()?;
                    inner.observe(key, previous, before, &reply)?;
                    inner.knowledge.remember(key, token, reply.deletions);
                    inner.replicas_acked(acked)?;
                    return Ok(Entered::Accepted { previous, in_flight });
                }
                Verdict::Stale => {
                    let current = reply.mark()?.unwrap_or_default();
                    inner.observe(key, Some(current), before, &reply)?;
                    inner.knowledge.remember(key, current, reply.deletions);
                    return Ok(Entered::Stale { current });
                }
                Verdict::Superseded => return Ok(Entered::Superseded { waiting: reply.mark()?.unwrap_or_default() }),
                Verdict::Held => {
                    let left = reply.ms()?;
                    inner.note_hold(left);
                    return Err(StoreError::Held { store: STORE, left });
                }
                Verdict::Busy => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(Entered::TimedOut);
                    }
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                other => return Err(other.unexpected()),
            }
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        let inner = &self.inner;
        let (from, exclusive) = match after {
            Some(a) if a >= prefix => (a, "1"),
            _ => (prefix, "0"),
        };
        let (limit, to, marks) = (limit.to_string(), upper_bound(prefix), inner.names.marks());
        let args: [&[u8]; 5] = [from.as_bytes(), exclusive.as_bytes(), limit.as_bytes(), &to, marks.as_bytes()];
        let keys = [inner.names.index(), inner.names.identity()];
        let reply = inner.run_bytes(&inner.scripts.list, &keys, &args).await?;
        let mut out = Vec::with_capacity(reply.rest.len() / 2);
        for pair in reply.rest.chunks_exact(2) {
            out.push((pair[0].clone(), parse_mark(Some(&pair[1]))?.unwrap_or_default()));
        }
        Ok(out)
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        let inner = &self.inner;
        let keys = [inner.names.index(), inner.names.identity()];
        let batch = DELETE_BATCH.to_string();
        let (from, to, limit) = match which {
            Selection::Key(k) => (lex_inclusive(k), lex_inclusive(k), "1"),
            Selection::Prefix(p) => (lex_inclusive(p), upper_bound(p), batch.as_str()),
        };
        let marks = inner.names.marks();
        let mut deleted = Deleted { count: 0, token: None };
        loop {
            let args: [&[u8]; 4] = [&from, &to, limit.as_bytes(), marks.as_bytes()];
            let reply = inner.run_bytes(&inner.scripts.delete, &keys, &args).await?;
            let count = parse_count(reply.rest.first())?;
            deleted.count += count;
            if let Selection::Key(_) = which {
                deleted.token = parse_mark(reply.rest.get(1))?;
            }
            // This replica's own remembered marks go now; the others' when
            // they see the deletions counter move.
            inner.knowledge.forget_seen();
            inner.knowledge.note_deletions(reply.deletions);
            if count == 0 || matches!(which, Selection::Key(_)) {
                return Ok(deleted);
            }
        }
    }

    async fn confirm(&self) -> Result<Option<Confirmed>, StoreError> {
        self.inner.confirm().await.map(Some)
    }

    fn set_write_lease(&self, longest: Duration) {
        self.inner.flights.configure(longest);
    }

    fn unready(&self) -> Option<String> {
        self.inner.unready()
    }

    fn tracked_keys(&self) -> usize {
        self.inner.tracked.load(Ordering::Relaxed)
    }

    fn cached_keys(&self) -> usize {
        self.inner.knowledge.seen_keys()
    }

    fn call_stats(&self) -> Option<&CallStats> {
        Some(&self.inner.calls)
    }

    /// Waits (at most a few calls' `timeout`) until the records of writes
    /// that ended are gone from Redis: at shutdown, so other replicas'
    /// raises of those keys need not wait for their leases.
    async fn close(&self) {
        let deadline = Instant::now() + self.inner.timeout * 4;
        while self.inner.flights.ending() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
