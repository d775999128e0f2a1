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

mod lease;
mod names;
mod share;
mod trust;

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, PutOptions, ResponseHeader,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::knowledge::Knowledge;
use super::{Advance, AtHand, Confirmed, Deleted, Entered, FenceStore, Found, Selection, StoreError, Unexpected};
use crate::config::EtcdConfig;
use crate::fence::gate::Ask;
use lease::{end_records, keep_alive, Lease};
use names::{mark_value, parse_mark, prefix_end, Names, Record};
use share::{keep_shares, Shares};
use trust::{health, Reachability};

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
    /// Records ended and not yet deleted.
    ending: AtomicUsize,
    /// This replica's shares of keys its writes hold (share.rs).
    shares: Shares,
    /// Numbers this replica's records.
    next_record: AtomicI64,
    replica: String,
    /// Until when fenced writes are held after a confirmation, as last read.
    held_until: std::sync::Mutex<Option<Instant>>,
    /// The longest write lease of the routes now (the hold after a confirmation).
    longest: std::sync::Mutex<Duration>,
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
            let mut tls = etcd_client::TlsOptions::new().with_native_roots();
            if let Some(ca) = &config.ca_file {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read("reading [fences] ca_file", ca)?));
            }
            if let Some((cert, key)) = &config.client_identity {
                let cert = read("reading [fences] cert_file", cert)?;
                let key = read("reading [fences] key_file", key)?;
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        let (ended, ended_rx) = mpsc::unbounded_channel();
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
            knowledge: Knowledge::new(config.cache_keys),
            cluster: trust::Cluster::default(),
            transition: tokio::sync::Mutex::new(()),
            reachable: Reachability::default(),
            tracked: AtomicUsize::new(0),
            lease: Lease::default(),
            ended,
            ending: AtomicUsize::new(0),
            shares: Shares::default(),
            next_record: AtomicI64::new(0),
            replica: super::knowledge::new_identity()?,
            held_until: std::sync::Mutex::new(None),
            longest: std::sync::Mutex::new(Duration::ZERO),
        });
        tokio::spawn(health(Arc::downgrade(&inner)));
        tokio::spawn(keep_alive(Arc::downgrade(&inner)));
        tokio::spawn(end_records(Arc::downgrade(&inner), ended_rx));
        tokio::spawn(keep_shares(Arc::downgrade(&inner)));
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
    /// The client of member `i`, connected if need be.
    async fn member(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let member = &self.members[i];
        let mut client = member.client.lock().await;
        if let Some(client) = &*client {
            return Ok(client.clone());
        }
        let connected = Client::connect([member.url.as_str()], Some(self.options.clone())).await?;
        *client = Some(connected.clone());
        Ok(connected)
    }

    /// The client of the member calls go to now (the watch's).
    async fn client(&self) -> Result<Client, StoreError> {
        let i = self.current.load(Ordering::Relaxed) % self.members.len();
        match tokio::time::timeout(self.timeout, self.member(i)).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => {
                self.current.store(i + 1, Ordering::Relaxed);
                Err(self.failed("connecting to etcd", &e))
            }
            Err(_) => Err(self.no_answer("connecting to etcd")),
        }
    }

    /// A call that failed with `e`: etcd is unreachable, unless it answered
    /// with an error of its own.
    fn failed(&self, context: &'static str, e: &etcd_client::Error) -> StoreError {
        let error = StoreError::Failed { store: STORE, context, message: e.to_string() };
        self.note_answer(if answered(e) { Ok(()) } else { Err(&error) });
        error
    }

    fn no_answer(&self, context: &'static str) -> StoreError {
        let error = StoreError::NoAnswer { store: STORE, context, after: self.timeout };
        self.note_answer(Err(&error));
        error
    }

    /// One etcd call, `call` made with a member's client, within `timeout`.
    /// A member that could not have taken it (it refused the connection, or
    /// has no leader) has it made again with the next member; one that took
    /// it and failed, or did not answer, sends the next calls to the next
    /// member, and this one fails (it may have been applied).
    async fn call<T, F, Fut>(&self, context: &'static str, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let count = self.members.len();
        let first = self.current.load(Ordering::Relaxed) % count;
        let mut unsent = None;
        for i in (first..first + count).map(|i| i % count) {
            let answer = tokio::time::timeout_at(deadline, async {
                let client = self.member(i).await?;
                call(client).await
            });
            match answer.await {
                Ok(Ok(answer)) => {
                    self.current.store(i, Ordering::Relaxed);
                    self.note_answer(Ok(()));
                    return Ok(answer);
                }
                Ok(Err(e)) if not_taken(&e) => {
                    tracing::debug!(error = %e, member = %self.members[i].url, "an etcd member cannot take calls; trying the next");
                    self.current.store(i + 1, Ordering::Relaxed);
                    unsent = Some(e);
                }
                Ok(Err(e)) => {
                    self.current.store(i + 1, Ordering::Relaxed);
                    return Err(self.failed(context, &e));
                }
                Err(_) => {
                    self.current.store(i + 1, Ordering::Relaxed);
                    return Err(self.no_answer(context));
                }
            }
        }
        Err(match unsent {
            Some(e) => self.failed(context, &e),
            None => self.no_answer(context),
        })
    }

    /// One transaction, its header checked against the cluster this replica trusts.
    async fn txn(&self, context: &'static str, txn: Txn) -> Result<(bool, Vec<TxnOpResponse>, i64), StoreError> {
        let floor = self.revision_floor();
        let mut answer = self.call(context, |mut c| c_txn(&mut c, &txn)).await?;
        let revision = self.observe_header(answer.take_header(), floor)?;
        Ok((answer.succeeded(), answer.op_responses(), revision))
    }

    /// A key's state (the mark, the records of its writes in flight, the
    /// wait, the hold, the deletions) read at one revision.
    async fn read(&self, key: &str, context: &'static str) -> Result<State, StoreError> {
        let n = &self.names;
        let txn = Txn::new().and_then([
            TxnOp::get(n.mark(key), None),
            TxnOp::get(n.flights(key), Some(GetOptions::new().with_prefix())),
            TxnOp::get(n.wait(key), None),
            TxnOp::get(n.held(), None),
            TxnOp::get(n.deletions(), None),
        ]);
        let (_, responses, revision) = self.txn(context, txn).await?;
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

    /// How long writes are held still, when a hold was found.
    async fn held_left(&self, held: &KeyValue) -> Result<Duration, StoreError> {
        let id = held.lease();
        let left = self
            .call("reading the hold after a confirmation", |mut c| async move { c.lease_time_to_live(id, None).await });
        let left = Duration::from_secs(left.await?.ttl().max(1) as u64);
        *self.held_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now() + left);
        Ok(left)
    }

    /// A new record's key for a write of `key`.
    fn record_key(&self, key: &str) -> String {
        let n = self.next_record.fetch_add(1, Ordering::Relaxed);
        format!("{}{}/{n}", self.names.flights(key), self.replica)
    }
}

impl FenceStore for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let inner = &self.inner;
        inner.trusted().await?;
        let before = inner.knowledge.before(key);
        let state = inner.read(key, "reading a mark").await?;
        let mark = state.mark()?;
        inner.observe(key, mark, before, state.deletions)?;
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
        inner.trusted().await?;
        loop {
            let before = inner.knowledge.before(key);
            let state = inner.read(key, "reading a mark").await?;
            let mark = state.mark()?;
            inner.observe(key, mark, before, state.deletions)?;
            if let Some(current) = mark.filter(|m| token < *m) {
                inner.knowledge.remember(key, current, state.deletions);
                return Ok(Advance::Stale { current });
            }
            let mark_key = inner.names.mark(key);
            let txn = Txn::new().when([unchanged(&mark_key, state.mark.as_ref())]).and_then([TxnOp::put(
                mark_key.as_str(),
                mark_value(token),
                None,
            )]);
            let (raised, _, _) = inner.txn("raising a mark", txn).await?;
            if raised {
                inner.knowledge.remember(key, token, state.deletions);
                return Ok(Advance::Accepted { previous: mark });
            }
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
        let deadline = Instant::now() + wait;
        inner.trusted().await?;
        let alone = ask == Ask::Alone;
        if !alone {
            if let Some(in_flight) = self.inner.join_share(key, token, lease) {
                return Ok(Entered::Accepted { previous: Some(token), in_flight });
            }
        }
        let lease_id = inner.lease_for(lease).await?;
        let (mark_key, wait_key) = (inner.names.mark(key), inner.names.wait(key));
        let mut pause = Duration::from_millis(1);
        let mut waiting = false;
        loop {
            let before = inner.knowledge.before(key);
            let state = inner.read(key, "reading a key's turn").await?;
            let mark = state.mark()?;
            inner.observe(key, mark, before, state.deletions)?;
            if let Some(held) = &state.held {
                let left = inner.held_left(held).await?;
                return Err(StoreError::Held { store: STORE, left });
            }
            if let Some(current) = mark.filter(|m| token < *m) {
                inner.knowledge.remember(key, current, state.deletions);
                return Ok(Entered::Stale { current });
            }
            let waiting_token = state.wait()?;
            if let Some(higher) = waiting_token.filter(|w| *w > token) {
                return Ok(Entered::Superseded { waiting: higher });
            }
            let records = state.flights.iter().map(|kv| Record::parse(kv.value())).collect::<Option<Vec<_>>>();
            let records =
                records.ok_or_else(|| unexpected(Found::Verdict("a record of a write that is not one".into())))?;
            let joins = !alone && mark == Some(token) && records.iter().all(|r| !r.alone && r.token == token);
            if records.is_empty() || joins {
                let record = inner.record_key(key);
                let mut then = vec![TxnOp::put(
                    record.as_str(),
                    Record { token, alone }.value(),
                    Some(PutOptions::new().with_lease(lease_id)),
                )];
                if mark != Some(token) {
                    then.push(TxnOp::put(mark_key.as_str(), mark_value(token), None));
                }
                if state.wait.is_some() {
                    // Ours, or a lower or equal one: this raise decides them.
                    then.push(TxnOp::delete(wait_key.as_str(), None));
                }
                let txn = Txn::new()
                    .when([
                        unchanged(&mark_key, state.mark.as_ref()),
                        unchanged(&wait_key, state.wait.as_ref()),
                        unchanged(&inner.names.held(), None),
                        // No write of the key recorded since the read (an
                        // empty range passes).
                        Compare::create_revision(inner.names.flights(key), CompareOp::Less, state.revision + 1)
                            .with_prefix(),
                    ])
                    .and_then(then);
                // Whatever happens from here, the record (if the
                // transaction wrote it before its answer was lost) ends.
                let pending = Pending(Some(record), &self.inner);
                let (entered, _, _) = inner.txn("raising a mark and recording the write", txn).await?;
                let record = pending.take();
                if entered {
                    inner.knowledge.remember(key, token, state.deletions);
                    let in_flight = if alone {
                        inner.ending.fetch_add(1, Ordering::AcqRel);
                        lease::recorded(&inner.ended, record)
                    } else {
                        self.inner.share(key, token, record)
                    };
                    return Ok(Entered::Accepted { previous: mark, in_flight });
                }
                // Something moved since the read (nothing was written):
                // decide again.
                continue;
            }
            // Other writes are in flight: wait for them, the token under
            // `wait/` so writes of the old mark that come meanwhile are refused.
            if waiting_token.is_none_or(|w| w < token) {
                let txn = Txn::new().when([unchanged(&wait_key, state.wait.as_ref())]).and_then([TxnOp::put(
                    wait_key.as_str(),
                    mark_value(token),
                    Some(PutOptions::new().with_lease(lease_id)),
                )]);
                inner.txn("waiting for a key's turn", txn).await?;
                waiting = true;
            }
            let now = Instant::now();
            if now >= deadline {
                if waiting {
                    inner.stop_waiting(&wait_key, token).await;
                }
                return Ok(Entered::TimedOut);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        let inner = &self.inner;
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
        let marks = inner.names.marks();
        let (from, options) = match which {
            Selection::Key(k) => (format!("{marks}{k}"), DeleteOptions::new().with_prev_key()),
            Selection::Prefix(p) => {
                let from = format!("{marks}{p}");
                let end = prefix_end(from.as_bytes());
                (from, DeleteOptions::new().with_range(end).with_prev_key())
            }
        };
        let mut deleted = Deleted { count: 0, token: None };
        loop {
            // A prefix in batches: the keys of one batch, then one
            // transaction that deletes them and counts the deletion.
            let batch = match which {
                Selection::Key(_) => None,
                Selection::Prefix(_) => {
                    let options = GetOptions::new()
                        .with_range(prefix_end(from.as_bytes()))
                        .with_limit(DELETE_BATCH)
                        .with_keys_only();
                    let page = inner.call("listing marks to delete", |mut c| c_get(&mut c, &from, &options));
                    let page = page.await?.take_kvs();
                    let Some(last) = page.last() else { return Ok(deleted) };
                    Some(DeleteOptions::new().with_range(prefix_end(last.key())).with_prev_key())
                }
            };
            let options = batch.unwrap_or_else(|| options.clone());
            let txn = Txn::new().and_then([
                TxnOp::delete(from.as_bytes(), Some(options)),
                TxnOp::put(inner.names.deletions(), "", None),
            ]);
            let (_, responses, _) = inner.txn("deleting marks", txn).await?;
            let Some(TxnOpResponse::Delete(answer)) = responses.into_iter().next() else {
                return Err(unexpected(Found::Empty));
            };
            deleted.count += answer.deleted().max(0) as u64;
            if let Selection::Key(_) = which {
                deleted.token = answer.prev_kvs().first().map(mark_of).transpose()?;
            }
            // This replica's own remembered marks go now; the others' when
            // they see the deletions counter move.
            inner.knowledge.forget_seen();
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

/// One member of the cluster, and its client once connected.
struct Member {
    url: String,
    client: tokio::sync::Mutex<Option<Client>>,
}

/// Whether a call that failed with `e` never reached etcd's log: the member
/// refused the connection, or has no leader (`require_leader`). Such a call
/// may be made again with another member.
fn not_taken(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message();
            // gRPC UNAVAILABLE.
            status.code() as i32 == 14
                && (message.contains("connect")
                    || message.contains("no leader")
                    || message.contains("Connection refused"))
        }
        _ => false,
    }
}

/// Whether etcd itself answered a call with the error `e` (a lease it does
/// not know, a request it refuses): it is reachable.
fn answered(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            // UNKNOWN (a transport error), CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE.
            !matches!(status.code() as i32, 1 | 2 | 4 | 14)
        }
        etcd_client::Error::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// `txn` on `client`, for [`Inner::call`].
fn c_txn(client: &mut Client, txn: &Txn) -> impl Future<Output = Result<etcd_client::TxnResponse, etcd_client::Error>> {
    let (mut client, txn) = (client.clone(), txn.clone());
    async move { client.txn(txn).await }
}

/// A range read on `client`, for [`Inner::call`].
fn c_get(
    client: &mut Client,
    from: &str,
    options: &GetOptions,
) -> impl Future<Output = Result<etcd_client::GetResponse, etcd_client::Error>> {
    let (mut client, from, options) = (client.clone(), from.to_owned(), options.clone());
    async move { client.get(from, Some(options)).await }
}

/// A record a transaction in flight may write: ended if the transaction's
/// answer is lost or the future is dropped before it comes. etcd may still
/// apply such a transaction after the delete (a member that took it was
/// frozen, and resumes): the delete is made again [`AGAIN_AFTER`] later,
/// so a record written late does not stand for the replica's whole life.
struct Pending<'a>(Option<String>, &'a Arc<Inner>);

/// When an uncertain record is deleted again.
const AGAIN_AFTER: [Duration; 2] = [Duration::from_secs(10), Duration::from_secs(120)];

impl Pending<'_> {
    fn take(mut self) -> String {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(record) = self.0.take() else { return };
        self.1.end_record(record.clone());
        let inner = Arc::downgrade(self.1);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for after in AGAIN_AFTER {
                    tokio::time::sleep(after).await;
                    let Some(inner) = inner.upgrade() else { return };
                    inner.end_record(record.clone());
                }
            });
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
