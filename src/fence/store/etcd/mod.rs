//! Strong fences: marks in etcd, for replicas of fencegate in front of the
//! same data that cannot accept Redis's asynchronous failover
//! (`[fences] store = "etcd"`).
//!
//! etcd keeps its keys by Raft: a transaction is answered once a quorum of
//! members committed it, and every read here is linearizable. Every
//! decision is one transaction that compares what the decision was made on
//! (the mark's and the wait's revisions, and that no record of a write of
//! the key appeared since) and writes the new mark and this write's record
//! together: nothing is forwarded before etcd committed it, and a decision
//! made on something that moved is made again. The turn rules are the Redis
//! store's (invariant 2 across replicas): the writes of the mark share the
//! key through any replica, a raise waits until every write in flight of
//! the old mark has ended (its token under `wait/`, so old-mark writes that
//! come meanwhile are refused), a write that holds the key alone waits for
//! every other. Where each thing lives: `names.rs`; the replica's lease its
//! records live under: `lease.rs`; whether the store is trusted: `trust.rs`.
//!
//! Any call not answered within `[fences] timeout` (no quorum, every
//! endpoint down or slow) refuses the write: 503, nothing forwarded. The
//! client fails over between the endpoints by itself.

mod batch;
mod client;
mod lease;
mod lease_records;
mod names;
mod share;
mod trust;
mod turn;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, ResponseHeader, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::knowledge::Knowledge;
use super::{
    Advance, AtHand, CallStats, Confirmed, Deleted, Entered, FenceStore, Found, LeaseRecord, Selection, StoreError,
    Unexpected,
};
use crate::config::EtcdConfig;
use crate::fence::gate::Ask;
use client::{c_get, c_txn, Member};
use lease::{end_records, keep_alive, Lease};
use names::{mark_value, parse_mark, prefix_end, KeyNames, Names};
use share::{keep_shares, Shares};
use trust::{health, Reachability};
use turn::Turn;

/// How this store names itself in what it reports.
const STORE: &str = "etcd";

/// Marks a prefix delete drops per transaction.
const DELETE_BATCH: i64 = 1000;

fn unexpected(found: Found) -> StoreError {
    StoreError::Unexpected(Unexpected { store: STORE, found })
}

/// Marks in etcd, shared by every fencegate that uses the same cluster and
/// `key_prefix`. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("prefix", &self.inner.names.prefix()).finish_non_exhaustive()
    }
}

struct Inner {
    /// One client per member, each connected at first use: fencegate starts
    /// (unready) while etcd is down. Calls go to the member that answered
    /// last, and move on to the next when one cannot take them.
    members: Vec<Member>,
    /// The member calls go to first.
    current: AtomicUsize,
    options: ConnectOptions,
    names: Names,
    timeout: Duration,
    /// The store's identity as this replica knows it, and the marks it saw.
    knowledge: Knowledge,
    /// The etcd cluster this replica adopted and the highest revision it
    /// saw: a cluster restored from an older snapshot answers below it.
    cluster: trust::Cluster,
    /// Identity changes (adoption, restore, an operator's confirmation) one
    /// at a time.
    transition: tokio::sync::Mutex<()>,
    reachable: Reachability,
    /// Keys with a mark in the store, as last counted.
    tracked: AtomicUsize,
    lease: Lease,
    /// Where records of ended writes go to be deleted.
    ended: mpsc::UnboundedSender<String>,
    /// Where turns' transactions go to be committed in batches (batch.rs).
    batches: mpsc::UnboundedSender<batch::Item>,
    /// Records ended and not yet deleted.
    ending: AtomicUsize,
    /// This replica's shares of keys its writes hold (share.rs).
    shares: Shares,
    /// Numbers this replica's records.
    next_record: AtomicI64,
    replica: String,
    /// Until when fenced writes are held after a confirmation, as last read.
    held_until: std::sync::Mutex<Option<Instant>>,
    /// The key of the last decision this replica committed (the health
    /// check reads its mark back).
    last_commit: std::sync::Mutex<Option<String>>,
    /// How often turns' guesses failed lately, as a score (turn.rs).
    guesses: std::sync::atomic::AtomicU32,
    /// The longest write lease of the routes now (the hold after a confirmation).
    longest: std::sync::Mutex<Duration>,
    /// Round trips, reconnects and trust, for `/metrics`.
    calls: Arc<CallStats>,
}

impl EtcdStore {
    /// Reads the TLS files now (a missing one stops fencegate, naming it);
    /// connects at first use, and starts the health check and the lease's
    /// keep-alive on the current runtime.
    pub fn open(config: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        let mut options = ConnectOptions::new()
            .with_timeout(config.timeout)
            .with_connect_timeout(config.timeout)
            .with_keep_alive(Duration::from_secs(1), config.timeout)
            .with_require_leader(true);
        if let Some((user, password)) = &config.credentials {
            options = options.with_user(user.clone(), password.clone());
        }
        if config.endpoints.iter().any(|e| e.starts_with("https://")) {
            let read = |context: &'static str, path: &std::path::Path| {
                std::fs::read(path).map_err(|e| StoreError::Io {
                    context,
                    source: Arc::new(std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
                })
            };
            // `ca_file`'s roots instead of the system's, as for Redis and
            // upstreams: a member must not pass on a public CA's word alone.
            let tls = etcd_client::TlsOptions::new();
            let mut tls = match &config.ca_file {
                Some(ca) => {
                    tls.ca_certificate(etcd_client::Certificate::from_pem(read("reading [fences] ca_file", ca)?))
                }
                None => tls.with_native_roots(),
            };
            if let Some((cert, key)) = &config.client_identity {
                let cert = read("reading [fences] cert_file", cert)?;
                let key = read("reading [fences] key_file", key)?;
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        let (ended, ended_rx) = mpsc::unbounded_channel();
        let (batches, batches_rx) = mpsc::unbounded_channel();
        let calls = Arc::new(CallStats::new("etcd"));
        let inner = Arc::new(Inner {
            members: config
                .endpoints
                .iter()
                .map(|url| Member { url: url.clone(), client: Default::default() })
                .collect(),
            current: AtomicUsize::new(0),
            options,
            names: Names::new(&config.key_prefix),
            timeout: config.timeout,
            knowledge: Knowledge::new(config.cache_keys, calls.clone()),
            cluster: trust::Cluster::default(),
            transition: tokio::sync::Mutex::new(()),
            reachable: Reachability::default(),
            tracked: AtomicUsize::new(0),
            lease: Lease::default(),
            ended,
            batches,
            ending: AtomicUsize::new(0),
            shares: Shares::default(),
            next_record: AtomicI64::new(0),
            replica: super::knowledge::new_identity()?,
            held_until: std::sync::Mutex::new(None),
            last_commit: std::sync::Mutex::new(None),
            guesses: std::sync::atomic::AtomicU32::new(0),
            longest: std::sync::Mutex::new(Duration::ZERO),
            calls,
        });
        tokio::spawn(health(Arc::downgrade(&inner)));
        tokio::spawn(keep_alive(Arc::downgrade(&inner)));
        tokio::spawn(end_records(Arc::downgrade(&inner), ended_rx));
        tokio::spawn(keep_shares(Arc::downgrade(&inner)));
        tokio::spawn(batch::send_batches(Arc::downgrade(&inner), batches_rx));
        Ok(EtcdStore { inner })
    }
}

/// What one read of a key's state found, at one revision.
struct State {
    revision: i64,
    mark: Option<KeyValue>,
    flights: Vec<KeyValue>,
    wait: Option<KeyValue>,
    held: Option<KeyValue>,
    deletions: u64,
}

impl State {
    fn mark(&self) -> Result<Option<u64>, StoreError> {
        self.mark.as_ref().map(mark_of).transpose()
    }

    fn wait(&self) -> Result<Option<u64>, StoreError> {
        self.wait.as_ref().map(mark_of).transpose()
    }
}

fn mark_of(kv: &KeyValue) -> Result<u64, StoreError> {
    parse_mark(kv.value()).ok_or_else(|| unexpected(Found::Mark(String::from_utf8_lossy(kv.value()).into_owned())))
}

/// Compares that `kv` (as read) is unchanged: same revision, or still absent.
fn unchanged(key: &str, kv: Option<&KeyValue>) -> Compare {
    match kv {
        Some(kv) => Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision()),
        None => Compare::version(key, CompareOp::Equal, 0),
    }
}

impl Inner {
    /// One transaction, its header checked against the cluster this replica trusts.
    async fn txn(&self, context: &'static str, txn: Txn) -> Result<(bool, Vec<TxnOpResponse>, i64), StoreError> {
        let floor = self.revision_floor();
        let mut answer = self.call(context, |mut c| c_txn(&mut c, &txn)).await?;
        let revision = self.observe_header(answer.take_header(), floor)?;
        Ok((answer.succeeded(), answer.op_responses(), revision))
    }

    /// The reads of a key's state (the mark, the records of its writes in
    /// flight, the wait, the hold, the deletions), for [`Inner::state`].
    fn read_ops(&self, names: &KeyNames) -> Vec<TxnOp> {
        vec![
            TxnOp::get(names.mark.as_str(), None),
            TxnOp::get(names.flights.as_str(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(names.wait.as_str(), None),
            TxnOp::get(self.names.held(), None),
            TxnOp::get(self.names.deletions(), None),
        ]
    }

    /// A key's state as the reads of [`Inner::read_ops`] answered it at `revision`.
    fn state(&self, responses: Vec<TxnOpResponse>, revision: i64) -> Result<State, StoreError> {
        let mut gets = responses.into_iter().map(|r| match r {
            TxnOpResponse::Get(mut get) => Ok(get.take_kvs()),
            _ => Err(unexpected(Found::Verdict("an answer to a read that is not a read".into()))),
        });
        let mut next = || gets.next().unwrap_or_else(|| Err(unexpected(Found::Empty)));
        let mark = next()?.pop();
        let flights = next()?;
        let wait = next()?.pop();
        let held = next()?.pop();
        let deletions = next()?.pop().map_or(0, |kv| kv.version().max(0) as u64);
        Ok(State { revision, mark, flights, wait, held, deletions })
    }

    /// A key's state read at one revision.
    async fn read(&self, names: &KeyNames, context: &'static str) -> Result<State, StoreError> {
        let (_, responses, revision) = self.txn(context, Txn::new().and_then(self.read_ops(names))).await?;
        self.state(responses, revision)
    }

    /// How long writes are held still, when a hold was found.
    async fn held_left(&self, held: &KeyValue) -> Result<Duration, StoreError> {
        let id = held.lease();
        let left = self
            .call("reading the hold after a confirmation", |mut c| async move { c.lease_time_to_live(id, None).await });
        // etcd answers whole seconds, rounded down: the hold may last up to
        // a second more than it says, and readiness must not come early.
        let left = Duration::from_secs(left.await?.ttl().max(0) as u64 + 1);
        *self.held_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now() + left);
        Ok(left)
    }

    /// A new record's key for a write of `key`.
    fn record_key(&self, names: &KeyNames) -> String {
        let n = self.next_record.fetch_add(1, Ordering::Relaxed);
        format!("{}{}/{n}", names.flights, self.replica)
    }
}

impl FenceStore for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let inner = &self.inner;
        inner.trusted().await?;
        let before = inner.knowledge.before(key);
        let state = inner.read(&inner.names.of(key), "reading a mark").await?;
        let mark = state.mark()?;
        inner.observe(key, mark, before, state.deletions)?;
        Ok(mark)
    }

    async fn lease(&self, key: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.lease_record(key).await
    }

    async fn swap_lease(
        &self,
        key: &str,
        expected: Option<&LeaseRecord>,
        new: Option<&LeaseRecord>,
    ) -> Result<bool, StoreError> {
        self.inner.swap_lease_record(key, expected, new).await
    }

    /// The mark this replica last saw for `key`: a token below it is stale
    /// whatever the store says now.
    fn at_hand(&self, key: &str) -> AtHand {
        AtHand::Floor(self.inner.knowledge.seen(key))
    }

    /// The fence API's raise. A token at the mark changes nothing. A higher
    /// one, recorded nowhere, waits (its token under `wait/`) until no
    /// replica's share of the key takes writes of the old token any more
    /// (each rewrites its record as draining when it sees the wait), at most
    /// the longest write lease: no write of the old token is let on after
    /// this returns. Writes already in flight may end after it, as on Redis.
    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        let inner = &self.inner;
        inner.trusted().await?;
        let wait = inner.longest().max(inner.timeout);
        match inner.turn(key, token, Turn::Raise, wait).await? {
            Entered::Accepted { previous, .. } => Ok(Advance::Accepted { previous }),
            Entered::Stale { current } => Ok(Advance::Stale { current }),
            // A raise is never refused for a higher token waiting: see turn.rs.
            Entered::Superseded { .. } | Entered::TimedOut => Err(StoreError::Failed {
                store: STORE,
                context: "raising a mark",
                message: format!("writes of the key stayed in flight for {wait:?}; try again"),
            }),
        }
    }

    /// A fenced write's turn of `key` across replicas: its mark raised (or
    /// shared) and the write recorded in flight until the returned
    /// [`InFlight`](super::InFlight) is dropped, or the replica's lease ends.
    /// Waits up to `wait` while other writes of the key are in flight.
    async fn enter(
        &self,
        key: &str,
        token: u64,
        ask: Ask,
        lease: Duration,
        wait: Duration,
    ) -> Result<Entered, StoreError> {
        let inner = &self.inner;
        inner.trusted().await?;
        let alone = ask == Ask::Alone;
        if !alone {
            if let Some(in_flight) = inner.join_share(key, token, lease) {
                return Ok(Entered::Accepted { previous: Some(token), in_flight });
            }
        }
        let lease_id = inner.lease_for(lease).await?;
        inner.turn(key, token, Turn::Write { alone, lease, lease_id }, wait).await
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        let inner = &self.inner;
        inner.trusted().await?;
        let marks = inner.names.marks();
        let from = match after {
            // The first key after `after`.
            Some(a) if a >= prefix => format!("{marks}{a}\0"),
            _ => format!("{marks}{prefix}"),
        };
        let end = prefix_end(format!("{marks}{prefix}").as_bytes());
        let options =
            GetOptions::new().with_range(end).with_limit(limit as i64).with_sort(SortTarget::Key, SortOrder::Ascend);
        let floor = inner.revision_floor();
        let mut answer = inner.call("listing marks", |mut c| c_get(&mut c, &from, &options)).await?;
        inner.observe_header(answer.take_header(), floor)?;
        let mut out = Vec::with_capacity(answer.kvs().len());
        for kv in answer.kvs() {
            let key = kv.key_str().map_err(|e| StoreError::Failed {
                store: STORE,
                context: "listing marks",
                message: e.to_string(),
            })?;
            out.push((key[marks.len()..].to_owned(), mark_of(kv)?));
        }
        Ok(out)
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        let inner = &self.inner;
        inner.trusted().await?;
        let marks = inner.names.marks();
        let from = match which {
            Selection::Key(k) => format!("{marks}{k}"),
            Selection::Prefix(p) => format!("{marks}{p}"),
        };
        let mut deleted = Deleted { count: 0, token: None };
        loop {
            // A key, with its mark answered; a prefix in batches: the keys of
            // one page, then one transaction that deletes exactly those (up
            // to the page's last key, not the keys that begin with it).
            let options = match which {
                Selection::Key(_) => DeleteOptions::new().with_prev_key(),
                Selection::Prefix(_) => {
                    let options = GetOptions::new()
                        .with_range(prefix_end(from.as_bytes()))
                        .with_limit(DELETE_BATCH)
                        .with_keys_only();
                    let page = inner.call("listing marks to delete", |mut c| c_get(&mut c, &from, &options));
                    let page = page.await?.take_kvs();
                    let Some(last) = page.last() else { return Ok(deleted) };
                    DeleteOptions::new().with_range([last.key(), b"\0"].concat())
                }
            };
            // The deletions counter moves in the same transaction, and is
            // read back: this replica forgets its marks under that count, so
            // a reply from before the delete cannot bring one back.
            let txn = Txn::new().and_then([
                TxnOp::delete(from.as_bytes(), Some(options)),
                TxnOp::put(inner.names.deletions(), "", None),
                TxnOp::get(inner.names.deletions(), None),
            ]);
            let (_, responses, _) = inner.txn("deleting marks", txn).await?;
            let mut responses = responses.into_iter();
            let Some(TxnOpResponse::Delete(answer)) = responses.next() else {
                return Err(unexpected(Found::Empty));
            };
            let Some(TxnOpResponse::Get(counted)) = responses.nth(1) else {
                return Err(unexpected(Found::Empty));
            };
            deleted.count += answer.deleted().max(0) as u64;
            if let Selection::Key(_) = which {
                deleted.token = answer.prev_kvs().first().map(mark_of).transpose()?;
            }
            // This replica's own remembered marks go now; the others' when
            // they see the deletions counter move.
            inner.knowledge.note_deletions(counted.kvs().first().map_or(0, |kv| kv.version().max(0) as u64));
            if matches!(which, Selection::Key(_)) || answer.deleted() == 0 {
                return Ok(deleted);
            }
        }
    }

    async fn confirm(&self) -> Result<Option<Confirmed>, StoreError> {
        self.inner.confirm().await.map(Some)
    }

    fn set_write_lease(&self, longest: Duration) {
        self.inner.lease.configure(longest);
        *self.inner.longest.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = longest;
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

    /// Waits (a few calls' `timeout` at most) until the records of writes
    /// that ended are gone, then revokes the replica's lease: other
    /// replicas' raises of those keys need not wait for it to end.
    async fn close(&self) {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.timeout * 4;
        while inner.ending.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if inner.ending.load(Ordering::Acquire) > 0 {
            return;
        }
        for id in inner.lease.all() {
            let _ =
                inner.call("revoking this replica's etcd lease", |mut c| async move { c.lease_revoke(id).await }).await;
        }
    }
}

impl Inner {
    /// Deletes the wait this replica put for `token`, if it is still there.
    async fn stop_waiting(&self, wait_key: &str, token: u64) {
        let txn = Txn::new()
            .when([Compare::value(wait_key, CompareOp::Equal, mark_value(token))])
            .and_then([TxnOp::delete(wait_key, None)]);
        if let Err(e) = self.txn("ending a wait for a key's turn", txn).await {
            tracing::debug!(error = %e, "ending a wait in etcd (it ends with the replica's lease)");
        }
    }

    /// Notes the header of an answer: the cluster must be the one this
    /// replica trusts, its revision not below `floor`, the highest seen
    /// when the call was sent. Returns the revision.
    fn observe_header(&self, header: Option<ResponseHeader>, floor: i64) -> Result<i64, StoreError> {
        let header = header.ok_or_else(|| unexpected(Found::Empty))?;
        self.check_cluster(header.cluster_id(), header.revision(), floor)?;
        Ok(header.revision())
    }
}
