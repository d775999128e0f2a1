//! Shared fences: marks in Redis, for replicas of fencegate in front of the
//! same data (`[fences] store = "redis"`).
//!
//! Every decision is one Lua script run server-side ([`scripts.lua`]): the
//! compare-and-raise and, for a fenced write, the record of the write in
//! flight that other replicas' raises wait for (invariant 2 across
//! replicas). A replica's own turns ([`crate::fence::KeyGate`]) still order
//! its requests; the store orders the replicas.
//!
//! In Redis, under `key_prefix` (`P`):
//! - `P mark:<key>`: the mark, a base-10 string;
//! - `P flight:<key>`: a sorted set of the writes of the key in flight on any
//!   replica, each scored with the Redis server time its lease ends (the route
//!   `timeout` plus `settle`, and a second): a replica that dies mid-write
//!   leaves entries that expire;
//! - `P wait:<key>`: the highest token waiting to raise the key, for as long
//!   as it waits, so the old holder's writes are refused meanwhile;
//! - `P shared:<key>`: the token the writes in flight carry: only writes
//!   with that token join them;
//! - `P keys`: every key with a mark, for listings and prefix deletes;
//! - `P identity`: the store's identity (`id`, `previous`, `deletions`),
//!   written at first use. A Redis that lost it (restarted without
//!   persistence, flushed), or that answers with a mark below one this
//!   replica saw (a failover to a replica that missed writes), is not
//!   trusted until an operator confirms it ([`RedisStore::confirm`]).
//!
//! Anything that keeps a call from answering within `timeout` (Redis down,
//! slow, a replica not acknowledging) refuses the write: 503, nothing
//! forwarded. The connection reconnects on its own with backoff.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, ScriptInvocation};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{Advance, Deleted, Entered, InFlight, Selection, StoreError};
use crate::config::RedisConfig;
use crate::config::RouteConfig;
use crate::fence::gate::Ask;
use crate::fence::KeyMap;

const SCRIPTS: &str = include_str!("scripts.lua");

/// Records of ended writes removed in one pipeline at most.
const END_BATCH: usize = 256;

/// How long records Redis did not take are sent again.
const END_RETRIES_FOR: Duration = Duration::from_secs(60);

/// Keys a prefix delete drops per script call: each call holds Redis alone.
const DELETE_BATCH: usize = 1000;

/// How often a replica reads the store's identity and size when nothing
/// else does: how soon `/readyz` sees Redis come back.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// Added to a write's lease beyond its route's `timeout` and `settle`: the
/// time between the lease's start in Redis and the forward's own clock.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// The longest lease a fenced write of `routes` is given (see
/// `crate::fence::service`: what is left of the wait for its turns, at most
/// a `queue_timeout`; a wait for an upstream connection, another; the
/// exchange, `timeout`; the wait for a body answered early to leave, another
/// `timeout`; and the settle period, at most the longest of any
/// route, a COPY's destination's included). The store adds its replica wait
/// and [`LEASE_MARGIN`].
pub fn longest_write_lease(routes: &[RouteConfig]) -> Duration {
    let settle = routes.iter().map(|r| r.settle).max().unwrap_or_default();
    let exchange = routes.iter().map(|r| r.queue_timeout * 2 + r.timeout * 2).max().unwrap_or_default();
    exchange + settle
}

/// The scripts of `scripts.lua`, each with the shared part before the first.
struct Scripts {
    enter: Script,
    raise: Script,
    get: Script,
    list: Script,
    delete: Script,
    confirm: Script,
    hold: Script,
    held: Script,
}

impl Scripts {
    fn load() -> Scripts {
        let mut parts = SCRIPTS.split("\n-- script: ");
        let shared = parts.next().unwrap_or_default();
        let mut named = std::collections::HashMap::new();
        for part in parts {
            let (name, body) = part.split_once('\n').unwrap_or((part, ""));
            named.insert(name.trim(), Script::new(&format!("{shared}\n{body}")));
        }
        let mut take = |name: &str| named.remove(name).unwrap_or_else(|| panic!("scripts.lua has no '{name}' script"));
        Scripts {
            enter: take("enter"),
            raise: take("raise"),
            get: take("get"),
            list: take("list"),
            delete: take("delete"),
            confirm: take("confirm"),
            hold: take("hold"),
            held: take("held"),
        }
    }
}

/// The Redis key names of one fence key.
struct Names {
    prefix: String,
}

impl Names {
    fn of(&self, what: &str, key: &str) -> String {
        let mut name = String::with_capacity(self.prefix.len() + what.len() + key.len());
        name.push_str(&self.prefix);
        name.push_str(what);
        name.push_str(key);
        name
    }
    fn mark(&self, key: &str) -> String {
        self.of("mark:", key)
    }
    fn index(&self) -> String {
        self.of("keys", "")
    }
    fn identity(&self) -> String {
        self.of("identity", "")
    }
}

/// What this replica knows of the store's identity.
#[derive(Debug, Default)]
struct Known {
    /// The identity adopted; `None` until the store was first reached.
    id: Option<String>,
    /// The deletions counted in the identity when last seen: when it moves,
    /// an operator deleted marks and the ones remembered may be gone for good.
    deletions: u64,
    /// Why the store is not trusted, until an operator confirms it.
    distrust: Option<String>,
    /// Until when fenced writes are held after an operator's confirmation,
    /// as last read from the store (`/readyz`; the store itself decides).
    held_until: Option<Instant>,
}

/// Marks in Redis, shared by every fencegate that uses the same server and
/// `key_prefix`. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.inner.names.prefix).finish_non_exhaustive()
    }
}

struct Inner {
    con: ConnectionManager,
    names: Names,
    scripts: Scripts,
    timeout: Duration,
    min_replicas: u32,
    replica_timeout: Duration,
    /// Names this replica's writes in flight: random per process.
    replica: String,
    next_write: AtomicU64,
    /// The highest mark this replica saw per key, up to `seen_cap` keys: a
    /// token below it is refused without a round trip, and a store that
    /// answers below it has lost writes.
    seen: KeyMap<u64>,
    seen_cap: usize,
    known: Mutex<Known>,
    /// `known.distrust.is_some()`, read without the lock on every request.
    distrusted: AtomicBool,
    /// Identity changes (adoption, restore, an operator's confirmation) one
    /// at a time.
    transition: tokio::sync::Mutex<()>,
    /// The last call reached Redis and was answered in time.
    reachable: AtomicBool,
    /// Keys with a mark in the store, as last counted.
    tracked: AtomicUsize,
    /// Records sent to [`end_records`] and not yet taken by Redis (or given up).
    ending: AtomicUsize,
    /// Records of writes whose turns ended, to [`end_records`].
    ends: mpsc::UnboundedSender<(String, String)>,
    /// The longest lease the routes give a write, in ms, as last configured
    /// ([`RedisStore::set_write_lease`]).
    write_lease_ms: AtomicU64,
    /// The longest lease this process gave a write, in ms: a reload that
    /// shortened the routes' timeouts leaves older writes with longer ones.
    given_lease_ms: AtomicU64,
}

/// What this replica knew of a key before a call ([`Inner::before`]).
#[derive(Clone, Copy)]
struct Before {
    seen: Option<u64>,
    deletions: u64,
}

/// One script's answer: its verdict, the store's deletions counter, and the rest.
struct Reply {
    verdict: String,
    deletions: u64,
    rest: Vec<String>,
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
        .map_err(|e| StoreError::redis("opening the Redis client", &e))?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout + config.replica_timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_secs(2))
            .set_number_of_retries(usize::MAX);
        let con = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| StoreError::redis("opening the Redis connection", &e))?;
        let (ends, ended) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            con,
            names: Names { prefix: config.key_prefix.clone() },
            scripts: Scripts::load(),
            timeout: config.timeout,
            min_replicas: config.min_replicas,
            replica_timeout: config.replica_timeout,
            replica: new_identity()?,
            next_write: AtomicU64::new(0),
            seen: KeyMap::default(),
            seen_cap: config.cache_keys,
            known: Mutex::new(Known::default()),
            distrusted: AtomicBool::new(false),
            transition: tokio::sync::Mutex::new(()),
            reachable: AtomicBool::new(false),
            tracked: AtomicUsize::new(0),
            ending: AtomicUsize::new(0),
            ends,
            write_lease_ms: AtomicU64::new(0),
            given_lease_ms: AtomicU64::new(0),
        });
        tokio::spawn(health(Arc::downgrade(&inner)));
        tokio::spawn(end_records(Arc::downgrade(&inner), ended));
        Ok(RedisStore { inner })
    }

    /// Waits (at most a few calls' `timeout`) until the records of writes
    /// that ended are gone from Redis: at shutdown, so other replicas'
    /// raises of those keys need not wait for their leases.
    pub async fn close(&self) {
        let deadline = Instant::now() + self.inner.timeout * 4;
        while self.inner.ending.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The mark this replica last saw for `key`: a token below it is stale
    /// whatever the store says now.
    pub fn seen(&self, key: &str) -> Option<u64> {
        self.inner.seen.get(key).map(|m| *m)
    }

    /// Why fenced writes are refused now, if they are (`/readyz`).
    pub fn unready(&self) -> Option<String> {
        let inner = &self.inner;
        let held_until = {
            let known = inner.known();
            if let Some(why) = &known.distrust {
                return Some(why.clone());
            }
            known.held_until
        };
        if !inner.reachable.load(Ordering::Acquire) {
            return Some("the Redis fence store is unreachable or slower than [fences] timeout".into());
        }
        let left = held_until.map(|until| until.saturating_duration_since(Instant::now())).unwrap_or_default();
        if !left.is_zero() {
            return Some(StoreError::Held(left).to_string());
        }
        None
    }

    /// The longest lease a route gives a write (see [`longest_write_lease`]):
    /// how long fenced writes are held after an operator confirms the store.
    /// Set at start and on every config reload.
    pub fn set_write_lease(&self, lease: Duration) {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.inner.write_lease_ms.store(ms, Ordering::Relaxed);
    }

    pub fn tracked_keys(&self) -> usize {
        self.inner.tracked.load(Ordering::Relaxed)
    }

    pub fn cached_keys(&self) -> usize {
        self.inner.seen.len()
    }

    pub async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let inner = &self.inner;
        let before = inner.before(key);
        let reply = inner.run_bytes(&inner.scripts.get, &[inner.names.mark(key), inner.names.identity()], &[]).await?;
        let mark = parse_mark(reply.rest.first())?;
        inner.observe(key, mark, before, &reply)?;
        Ok(mark)
    }

    /// The fence API's raise: compare-and-raise, no turn.
    pub async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        let inner = &self.inner;
        let keys = [inner.names.mark(key), inner.names.index(), inner.names.identity()];
        let before = inner.before(key);
        let (reply, acked) =
            inner.run_waiting(&inner.scripts.raise, &keys, &[token.to_string(), key.to_owned()]).await?;
        let mark = parse_mark(reply.rest.first())?;
        inner.observe(key, mark, before, &reply)?;
        match reply.verdict.as_str() {
            "ok" => {
                inner.remember(key, token, &reply);
                // An operator's raise shuts out an old holder only once the
                // replicas asked for have it, as a write's does.
                inner.replicas_acked(acked)?;
                Ok(Advance::Accepted { previous: mark })
            }
            "stale" => Ok(Advance::Stale { current: mark.unwrap_or_default() }),
            other => Err(StoreError::unexpected(other)),
        }
    }

    /// A fenced write's turn of `key` across replicas: its mark raised (or
    /// shared) and the write recorded in flight until the returned
    /// [`InFlight`] is dropped, or its lease ends. Waits up to `wait` while
    /// other replicas' writes of the key are in flight.
    pub async fn enter(
        &self,
        key: &str,
        token: u64,
        ask: Ask,
        lease: Duration,
        wait: Duration,
    ) -> Result<Entered, StoreError> {
        let inner = &self.inner;
        let deadline = Instant::now() + wait;
        let n = inner.next_write.fetch_add(1, Ordering::Relaxed);
        let member = format!("{}:{n}", inner.replica);
        let flight = inner.names.of("flight:", key);
        let keys = [
            inner.names.mark(key),
            flight.clone(),
            inner.names.of("wait:", key),
            inner.names.index(),
            inner.names.identity(),
            inner.names.of("shared:", key),
        ];
        // The decision's answer may wait for the replicas first.
        let replicas = if inner.min_replicas > 0 { inner.replica_timeout } else { Duration::ZERO };
        let lease_ms = (lease + replicas + LEASE_MARGIN).as_millis().max(1);
        inner.given_lease_ms.fetch_max(u64::try_from(lease_ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        let lease_ms = lease_ms.to_string();
        let alone = if ask == Ask::Alone { "1" } else { "0" };
        let mut pause = Duration::from_millis(1);
        loop {
            let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis().max(1).to_string();
            let before = inner.before(key);
            let args = [token.to_string(), member.clone(), lease_ms.clone(), alone.into(), wait_ms, key.to_owned()];
            let (reply, acked) = match inner.run_waiting(&inner.scripts.enter, &keys, &args).await {
                Ok(answer) => answer,
                Err(e) => {
                    // The script may have run before the answer was lost: its
                    // record, if any, must not hold the key for its whole
                    // lease. (Ending a record that is not there does nothing.)
                    inner.end((flight, member));
                    return Err(e);
                }
            };
            match reply.verdict.as_str() {
                "ok" => {
                    // Ends the record on any way out from here.
                    let in_flight = InFlight::redis(Flight { inner: self.inner.clone(), flight, member });
                    let previous = parse_mark(reply.rest.first())?;
                    inner.observe(key, previous, before, &reply)?;
                    inner.remember(key, token, &reply);
                    inner.replicas_acked(acked)?;
                    return Ok(Entered::Accepted { previous, in_flight });
                }
                "stale" => {
                    let current = parse_mark(reply.rest.first())?.unwrap_or_default();
                    inner.observe(key, Some(current), before, &reply)?;
                    inner.remember(key, current, &reply);
                    return Ok(Entered::Stale { current });
                }
                "superseded" => {
                    return Ok(Entered::Superseded { waiting: parse_mark(reply.rest.first())?.unwrap_or_default() })
                }
                "held" => {
                    let left = parse_ms(reply.rest.first())?;
                    inner.note_hold(left);
                    return Err(StoreError::Held(left));
                }
                "busy" => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(Entered::TimedOut);
                    }
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                other => return Err(StoreError::unexpected(other)),
            }
        }
    }

    pub async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let inner = &self.inner;
        let (from, exclusive) = match after {
            Some(a) if a >= prefix => (a, "1"),
            _ => (prefix, "0"),
        };
        let (limit, to, mark_prefix) = (limit.to_string(), upper_bound(prefix), inner.names.mark(""));
        let args: [&[u8]; 5] = [from.as_bytes(), exclusive.as_bytes(), limit.as_bytes(), &to, mark_prefix.as_bytes()];
        let keys = [inner.names.index(), inner.names.identity()];
        let reply = inner.run_bytes(&inner.scripts.list, &keys, &args).await?;
        let mut out = Vec::with_capacity(reply.rest.len() / 2);
        for pair in reply.rest.chunks_exact(2) {
            out.push((pair[0].clone(), parse_mark(Some(&pair[1]))?.unwrap_or_default()));
        }
        Ok(out)
    }

    pub async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        let inner = &self.inner;
        let keys = [inner.names.index(), inner.names.identity()];
        let batch = DELETE_BATCH.to_string();
        let (from, to, limit) = match which {
            Selection::Key(k) => (lex_inclusive(k), lex_inclusive(k), "1"),
            Selection::Prefix(p) => (lex_inclusive(p), upper_bound(p), batch.as_str()),
        };
        let mark_prefix = inner.names.mark("");
        let mut deleted = Deleted { count: 0, token: None };
        loop {
            let args: [&[u8]; 4] = [&from, &to, limit.as_bytes(), mark_prefix.as_bytes()];
            let reply = inner.run_bytes(&inner.scripts.delete, &keys, &args).await?;
            let count: u64 = reply.rest.first().and_then(|c| c.parse().ok()).unwrap_or_default();
            deleted.count += count;
            if let Selection::Key(_) = which {
                deleted.token = parse_mark(reply.rest.get(1))?;
            }
            // This replica's own remembered marks go now; the others' when
            // they see the deletions counter move.
            inner.seen.clear();
            inner.note_deletions(reply.deletions);
            if count == 0 || matches!(which, Selection::Key(_)) {
                return Ok(deleted);
            }
        }
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
    /// longest lease a write may have ([`Inner::hold_for`]), at least long
    /// enough for the other replicas to restore their marks. Each replica
    /// that adopts the identity lengthens the hold to its own longest lease.
    pub async fn confirm(&self) -> Result<Confirmed, StoreError> {
        let inner = &self.inner;
        let _one = inner.transition.lock().await;
        let restored = inner.restore().await?;
        let previous = {
            let known = inner.known();
            known.id.clone()
        };
        let found = inner.read_identity().await?.0;
        let previous = previous.or(found).unwrap_or_default();
        let id = new_identity()?;
        let hold = inner.hold_for();
        let mut invocation = inner.scripts.confirm.prepare_invoke();
        invocation.key(inner.names.identity()).arg(&id).arg(&previous).arg(hold.as_millis().max(1).to_string());
        let reply = Reply::parse(inner.invoke(&invocation, false).await?.0)?;
        if reply.verdict != "ok" {
            return Err(StoreError::unexpected(&reply.verdict));
        }
        // Writes wait on the store's hold; this replica's marks are in it.
        inner.adopt(id.clone(), reply.deletions);
        inner.note_hold(hold);
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

/// What [`RedisStore::confirm`] did.
#[derive(Debug, Clone)]
pub struct Confirmed {
    pub identity: String,
    pub previous: String,
    pub restored: u64,
    /// How long every replica's fenced writes are held from the confirmation.
    pub held: Duration,
}

/// A fenced write recorded in flight in Redis: dropping it ends the record.
pub struct Flight {
    inner: Arc<Inner>,
    flight: String,
    member: String,
}

impl std::fmt::Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flight").field("member", &self.member).finish_non_exhaustive()
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let record = (std::mem::take(&mut self.flight), std::mem::take(&mut self.member));
        // The task that ends records is gone only when the store is: the
        // process is stopping, and the lease ends the record.
        self.inner.end(record);
    }
}

/// Ends the records of writes whose turns ended, as many as have queued in
/// one pipeline: under load, one write to Redis for many of them. A batch
/// Redis did not take (it was down) is sent again, with backoff, for up to
/// [`END_RETRIES_FOR`]: a record left behind would hold every other
/// replica's raise of its key until its lease ends.
async fn end_records(inner: Weak<Inner>, mut ended: mpsc::UnboundedReceiver<(String, String)>) {
    let mut batch = Vec::new();
    let mut failing_since: Option<Instant> = None;
    let mut pause = Duration::from_millis(50);
    loop {
        if batch.is_empty() && ended.recv_many(&mut batch, END_BATCH).await == 0 {
            return;
        }
        while batch.len() < END_BATCH {
            match ended.try_recv() {
                Ok(record) => batch.push(record),
                Err(_) => break,
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        let mut pipe = redis::pipe();
        for (flight, member) in &batch {
            pipe.cmd("ZREM").arg(flight).arg(member).ignore();
        }
        let mut con = inner.con.clone();
        let answer = tokio::time::timeout(inner.timeout, pipe.query_async::<()>(&mut con)).await;
        match inner.answered(answer, "ending writes' records") {
            Ok(()) => {
                inner.ending.fetch_sub(batch.len(), Ordering::AcqRel);
                batch.clear();
                failing_since = None;
                pause = Duration::from_millis(50);
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > END_RETRIES_FOR {
                    // They end with their leases.
                    warn!(error = %e, records = batch.len(), "records of writes in the Redis fence store stay until their leases end");
                    inner.ending.fetch_sub(batch.len(), Ordering::AcqRel);
                    batch.clear();
                    failing_since = None;
                }
                drop(inner);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

impl Inner {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues the record of a write whose turn ended for [`end_records`].
    fn end(&self, record: (String, String)) {
        self.ending.fetch_add(1, Ordering::AcqRel);
        // The task is gone only when the store is: the lease ends the record.
        if self.ends.send(record).is_err() {
            self.ending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Refuses a decision fewer Redis replicas than `min_replicas` acknowledged.
    fn replicas_acked(&self, acked: Option<i64>) -> Result<(), StoreError> {
        match acked {
            Some(acked) if acked < i64::from(self.min_replicas) => {
                Err(StoreError::Replicas { acked, wanted: self.min_replicas, within: self.replica_timeout })
            }
            _ => Ok(()),
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd, context: &'static str) -> Result<T, StoreError> {
        let mut con = self.con.clone();
        let answer = tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut con)).await;
        self.answered(answer, context)
    }

    fn answered<T>(
        &self,
        answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
        context: &'static str,
    ) -> Result<T, StoreError> {
        let result = match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(StoreError::redis(context, &e)),
            Err(_) => Err(StoreError::RedisTimeout { context, after: self.timeout }),
        };
        let was = self.reachable.swap(result.is_ok(), Ordering::AcqRel);
        match (&result, was) {
            (Err(e), true) => warn!(error = %e, "the Redis fence store stopped answering: fenced writes get 503"),
            (Ok(_), false) => info!("the Redis fence store answers"),
            _ => {}
        }
        result
    }

    /// Runs `script` with this replica's identity first in its arguments,
    /// adopting (or distrusting) what the store says when it differs.
    async fn run_bytes(&self, script: &Script, keys: &[String], args: &[&[u8]]) -> Result<Reply, StoreError> {
        Ok(self.run_inner(script, keys, args, false).await?.0)
    }

    /// [`run_bytes`](Self::run_bytes), then `WAIT` for `min_replicas` in the same
    /// pipeline (so on the same connection), when they are asked for.
    async fn run_waiting(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<(Reply, Option<i64>), StoreError> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.run_inner(script, keys, &args, self.min_replicas > 0).await
    }

    async fn run_inner(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&[u8]],
        wait: bool,
    ) -> Result<(Reply, Option<i64>), StoreError> {
        // An identity that changed is adopted (or distrusted) and the script
        // runs again: at most twice.
        for _ in 0..2 {
            let id = self.identity().await?;
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(key.as_str());
            }
            invocation.arg(id.as_str());
            for arg in args {
                invocation.arg(*arg);
            }
            let (values, acked) = self.invoke(&invocation, wait).await?;
            let reply = Reply::parse(values)?;
            if reply.verdict == "identity" {
                self.judge().await?;
                continue;
            }
            self.note_deletions(reply.deletions);
            return Ok((reply, acked));
        }
        Err(StoreError::Distrusted("the Redis fence store's identity keeps changing".into()))
    }

    async fn invoke(
        &self,
        invocation: &ScriptInvocation<'_>,
        wait: bool,
    ) -> Result<(Vec<String>, Option<i64>), StoreError> {
        let mut con = self.con.clone();
        if !wait {
            let answer = tokio::time::timeout(self.timeout, invocation.invoke_async::<Vec<String>>(&mut con)).await;
            return self.answered(answer, "running a fence script").map(|v| (v, None));
        }
        let within = self.timeout + self.replica_timeout;
        let replica_ms = self.replica_timeout.as_millis().max(1);
        for attempt in 0..2 {
            let mut pipe = redis::pipe();
            pipe.invoke_script(invocation).cmd("WAIT").arg(self.min_replicas).arg(replica_ms as u64);
            let answer = tokio::time::timeout(within, pipe.query_async::<(Vec<String>, i64)>(&mut con)).await;
            match answer {
                Ok(Err(e))
                    if attempt == 0 && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let load = tokio::time::timeout(self.timeout, invocation.load_async(&mut con)).await;
                    self.answered(load, "loading a fence script")?;
                }
                answer => return self.answered(answer, "running a fence script").map(|(v, n)| (v, Some(n))),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// The identity to run scripts with: the one adopted, or the store's
    /// (created at first use).
    async fn identity(&self) -> Result<String, StoreError> {
        {
            let known = self.known();
            if let Some(why) = &known.distrust {
                return Err(StoreError::Distrusted(why.clone()));
            }
            if let Some(id) = &known.id {
                return Ok(id.clone());
            }
        }
        self.judge().await?;
        let known = self.known();
        match (&known.distrust, &known.id) {
            (Some(why), _) => Err(StoreError::Distrusted(why.clone())),
            (None, Some(id)) => Ok(id.clone()),
            (None, None) => Err(StoreError::Distrusted("the Redis fence store has no identity yet".into())),
        }
    }

    async fn read_identity(&self) -> Result<(Option<String>, Option<String>, u64), StoreError> {
        let mut read = redis::cmd("HMGET");
        read.arg(self.names.identity()).arg("id").arg("previous").arg("deletions");
        let (id, previous, deletions): (Option<String>, Option<String>, Option<u64>) =
            self.query(&read, "reading the fence store's identity").await?;
        Ok((id.filter(|s| !s.is_empty()), previous.filter(|s| !s.is_empty()), deletions.unwrap_or_default()))
    }

    /// What the store's identity means for this replica, read afresh under
    /// the transition lock (another task may have adopted one meanwhile).
    async fn judge(&self) -> Result<(), StoreError> {
        let _one = self.transition.lock().await;
        let (id, previous, deletions) = self.read_identity().await?;
        let ours = self.known().id.clone();
        match (ours, (id, previous)) {
            (None, (None, _)) => {
                // First contact with an empty store: whoever writes it
                // first, every replica adopts it.
                let mut create = redis::cmd("HSETNX");
                create.arg(self.names.identity()).arg("id").arg(new_identity()?);
                self.query::<i64>(&create, "writing the fence store's identity").await?;
                let (id, _, deletions) = self.read_identity().await?;
                let Some(id) = id else {
                    return Err(StoreError::Distrusted(
                        "the Redis fence store's identity vanished as it was written".into(),
                    ));
                };
                info!(identity = %id, "the Redis fence store had no identity: it has one now, taken as a new store");
                self.adopt(id, deletions);
            }
            (None, (Some(id), _)) => {
                info!(identity = %id, "using the Redis fence store");
                self.adopt(id, deletions);
            }
            // The store this replica trusts: its deletions counted, and
            // only its (another store's count must not clear the marks a
            // confirm would restore).
            (Some(ours), (Some(id), _)) if id == ours => self.note_deletions(deletions),
            (Some(ours), (Some(id), Some(previous))) if previous == ours => {
                // An operator confirmed the store through another replica.
                // Until this replica's own marks are back in it, nothing goes.
                self.distrust(
                    format!(
                        "restoring this replica's marks into the Redis fence store, which an operator confirmed \
                         (identity {id})"
                    ),
                    false,
                );
                let restored = self.restore().await?;
                // This replica's writes admitted before the loss may still
                // be in flight, with leases the confirming replica may not
                // know of: the hold lasts at least as long as they may.
                let hold = self.hold_for();
                let mut invocation = self.scripts.hold.prepare_invoke();
                invocation.key(self.names.identity()).arg(&id).arg(hold.as_millis().max(1).to_string());
                let reply = Reply::parse(self.invoke(&invocation, false).await?.0)?;
                if reply.verdict != "ok" {
                    // The identity changed again meanwhile: judged afresh next time.
                    return Ok(());
                }
                let left = parse_ms(reply.rest.first())?;
                warn!(
                    identity = %id,
                    restored,
                    held_for = %humantime::format_duration(left),
                    "adopting the Redis fence store's identity an operator confirmed"
                );
                self.adopt(id, deletions);
                self.note_hold(left);
            }
            (Some(ours), (found, _)) => {
                let why = match found {
                    None => format!(
                        "the Redis fence store lost its identity (was {ours}): it was restarted without its data, \
                         flushed, or replaced, and its marks may have gone back"
                    ),
                    Some(id) => format!(
                        "the Redis fence store's identity changed from {ours} to {id}: it is not the store this replica used"
                    ),
                };
                self.distrust(why, true);
            }
        }
        Ok(())
    }

    /// How long fenced writes are held after a confirmation, from its
    /// moment: the longest lease a write of this replica may have (its
    /// routes', or a longer one it gave before a reload), and at least the
    /// time the other replicas take to see the new identity and restore
    /// their marks (their health check runs every [`HEALTH_EVERY`]).
    fn hold_for(&self) -> Duration {
        let replicas = if self.min_replicas > 0 { self.replica_timeout } else { Duration::ZERO };
        let configured = Duration::from_millis(self.write_lease_ms.load(Ordering::Relaxed)) + replicas + LEASE_MARGIN;
        let given = Duration::from_millis(self.given_lease_ms.load(Ordering::Relaxed));
        configured.max(given).max(HEALTH_EVERY + self.timeout * 2)
    }

    /// The store holds fenced writes for `left` more (`/readyz` says so).
    fn note_hold(&self, left: Duration) {
        let mut known = self.known();
        known.held_until = (!left.is_zero()).then(|| Instant::now() + left);
    }

    fn adopt(&self, id: String, deletions: u64) {
        let mut known = self.known();
        known.id = Some(id);
        known.deletions = deletions;
        known.distrust = None;
        self.distrusted.store(false, Ordering::Release);
    }

    /// Refuses every fenced write until an operator confirms the store
    /// (`loud`: with an ERROR line the first time), or the replica adopts the
    /// identity it confirmed.
    fn distrust(&self, why: String, loud: bool) {
        let mut known = self.known();
        if loud && known.distrust.is_none() {
            error!(
                "{why}. Fenced writes are refused (503) until an operator restores the fences or confirms the store: \
                 `fencegate fence confirm-store` or POST /fences/store/confirm on the admin listener"
            );
        }
        known.distrust = Some(why);
        self.distrusted.store(true, Ordering::Release);
    }

    /// What this replica knew of `key` before a call: the call's answer
    /// must not be below it.
    fn before(&self, key: &str) -> Before {
        // The deletions first: a mark remembered after them is from a reply
        // at least as new.
        let deletions = self.known().deletions;
        Before { seen: self.seen.get(key).map(|m| *m), deletions }
    }

    /// The store answered `mark` for `key` to a call sent after `before` was
    /// taken. Redis runs a connection's calls in the order sent, and the
    /// mark `before` saw was answered before this call was sent: a healthy
    /// store cannot answer less (unless an operator deleted marks since).
    fn observe(&self, key: &str, mark: Option<u64>, before: Before, reply: &Reply) -> Result<(), StoreError> {
        let Some(seen) = before.seen else { return Ok(()) };
        if reply.deletions != before.deletions {
            return Ok(());
        }
        if mark.is_none_or(|m| m < seen) {
            let shown = mark.map_or_else(|| "no mark".to_owned(), |m| format!("mark {m}"));
            self.distrust(
                format!(
                    "the Redis fence store answered {shown} for key {key:?}, below the mark {seen} this replica saw: \
                     it lost writes (a restart without persistence, or a failover to a replica that missed them)"
                ),
                true,
            );
            return Err(StoreError::Distrusted(format!("the Redis fence store lost the mark of {key:?}")));
        }
        Ok(())
    }

    /// Remembers that `key`'s mark reached `mark` (in `reply`).
    fn remember(&self, key: &str, mark: u64, reply: &Reply) {
        // Held while remembering: a deletion seen meanwhile clears after.
        let known = self.known();
        if reply.deletions != known.deletions {
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
    fn note_deletions(&self, deletions: u64) {
        let mut known = self.known();
        if deletions > known.deletions {
            known.deletions = deletions;
            // Under the lock: a reply that saw the old count no longer
            // remembers anything once this returns.
            self.seen.clear();
        }
    }

    /// Raises every remembered mark back into the store, whatever its
    /// identity says (an operator asked for it).
    async fn restore(&self) -> Result<u64, StoreError> {
        let marks: Vec<(String, u64)> = self.seen.iter().map(|e| (e.key().to_string(), *e.value())).collect();
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
                pipe.cmd("WAIT").arg(self.min_replicas).arg(self.replica_timeout.as_millis().max(1) as u64);
            }
            self.query_pipe(&pipe, "restoring marks into the fence store").await?;
            restored += chunk.len() as u64;
        }
        Ok(restored)
    }

    async fn query_pipe(&self, pipe: &redis::Pipeline, context: &'static str) -> Result<(), StoreError> {
        let mut con = self.con.clone();
        // The raise script is loaded first: a restore may be the first use of
        // a Redis that restarted.
        let load = tokio::time::timeout(self.timeout, self.scripts.raise.prepare_invoke().load_async(&mut con)).await;
        self.answered(load, context)?;
        let within = self.timeout * 4 + self.replica_timeout;
        let answer = tokio::time::timeout(within, pipe.query_async::<Vec<i64>>(&mut con)).await;
        let acked = self.answered(answer, context)?;
        match acked.last() {
            Some(&acked) if self.min_replicas > 0 && acked < i64::from(self.min_replicas) => {
                Err(StoreError::Replicas { acked, wanted: self.min_replicas, within: self.replica_timeout })
            }
            _ => Ok(()),
        }
    }
}

impl Reply {
    fn parse(values: Vec<String>) -> Result<Reply, StoreError> {
        let mut values = values.into_iter();
        let verdict = values.next().ok_or_else(|| StoreError::unexpected("an empty answer"))?;
        if verdict == "identity" {
            // identity, id, previous, deletions
            let rest: Vec<String> = values.collect();
            let deletions = rest.get(2).and_then(|d| d.parse().ok()).unwrap_or_default();
            return Ok(Reply { verdict, deletions, rest });
        }
        let deletions = values.next().and_then(|d| d.parse().ok()).unwrap_or_default();
        Ok(Reply { verdict, deletions, rest: values.collect() })
    }
}

/// Milliseconds a script answered, as a duration.
fn parse_ms(value: Option<&String>) -> Result<Duration, StoreError> {
    value
        .and_then(|text| text.parse().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| StoreError::unexpected("a duration that is not a number of milliseconds"))
}

fn parse_mark(value: Option<&String>) -> Result<Option<u64>, StoreError> {
    match value.map(String::as_str) {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| StoreError::unexpected("a mark that is not a token")),
    }
}

/// `[key`: a lexicographic range bound that includes `key`.
fn lex_inclusive(key: &str) -> Vec<u8> {
    let mut bound = Vec::with_capacity(key.len() + 1);
    bound.push(b'[');
    bound.extend_from_slice(key.as_bytes());
    bound
}

/// The upper bound of the keys starting with `prefix`: every byte of a
/// UTF-8 key is below 0xff.
fn upper_bound(prefix: &str) -> Vec<u8> {
    if prefix.is_empty() {
        return b"+".to_vec();
    }
    let mut bound = lex_inclusive(prefix);
    bound.push(0xff);
    bound
}

/// A random identity for a store. Random or nothing: two stores (or two
/// replicas' records) must never be named alike.
fn new_identity() -> Result<String, StoreError> {
    let random = || {
        getrandom::u64().map_err(|e| StoreError::Io {
            context: "reading the system's random source",
            source: Arc::new(std::io::Error::other(e.to_string())),
        })
    };
    Ok(format!("{:016x}{:016x}", random()?, random()?))
}

/// Reads the store's identity and size every [`HEALTH_EVERY`], so readiness
/// follows Redis going and coming back with no traffic, and a flushed store
/// is noticed before the next write.
async fn health(inner: Weak<Inner>) {
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
            if let Ok(left) = Reply::parse(values).and_then(|reply| parse_ms(reply.rest.first())) {
                self.note_hold(left);
            }
        }
        let mut count = redis::cmd("ZCARD");
        count.arg(self.names.index());
        if let Ok(n) = self.query::<usize>(&count, "counting the fence store's keys").await {
            self.tracked.store(n, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_route_config;

    /// The hold after a confirm covers the longest lease any route gives a
    /// write: two queue timeouts and two timeouts (the exchange, and the wait
    /// for a body answered early) of the same route, and the longest settle of any (a COPY's destination may settle longer).
    #[test]
    fn the_longest_write_lease_covers_every_route_and_the_longest_settle() {
        let s = Duration::from_secs;
        let slow =
            RouteConfig { timeout: s(30), queue_timeout: s(10), settle: s(0), ..test_route_config("slow", "/slow/") };
        let settles =
            RouteConfig { timeout: s(2), queue_timeout: s(1), settle: s(5), ..test_route_config("settles", "/s/") };
        assert_eq!(longest_write_lease(&[slow.clone(), settles.clone()]), s(20 + 60 + 5));
        assert_eq!(longest_write_lease(&[settles]), s(2 + 4 + 5));
        assert_eq!(longest_write_lease(&[]), Duration::ZERO);
    }

    #[test]
    fn milliseconds_from_a_script_are_read_or_refused() {
        assert_eq!(parse_ms(Some(&"1500".to_owned())).unwrap(), Duration::from_millis(1500));
        assert!(parse_ms(Some(&"1.5e+12".to_owned())).is_err());
        assert!(parse_ms(None).is_err());
    }
}
