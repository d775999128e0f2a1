//! Records of fenced writes in flight in Redis: their names, their leases,
//! and their end.
//!
//! A record is a member of the key's `flight:` sorted set, scored with the
//! Redis server time its lease ends. The `enter` script adds it; when the
//! write's turn ends, the record is queued to [`end_records`], which removes
//! many at once. A replica that dies mid-write leaves records whose leases
//! run out.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::scripts::millis;
use super::Inner;
use crate::fence::store::WriteRecord;

/// Added to a write's lease beyond what its route gives it: the time
/// between the lease's start in Redis and the forward's own clock.
pub(super) const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Records of ended writes removed in one pipeline at most.
const END_BATCH: usize = 256;

/// How long records Redis did not take are sent again.
const END_RETRIES_FOR: Duration = Duration::from_secs(60);

/// The first pause before a batch Redis did not take is sent again, and
/// the longest: the pause doubles in between.
const END_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// One write's record: the key's `flight:` set, and the write's member in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub flight: String,
    pub member: String,
}

/// This replica's writes in flight: how their records are named, how long
/// their leases are, and the queue that ends them.
pub(super) struct Flights {
    /// Names this replica's records: random per process.
    replica: String,
    next: AtomicU64,
    /// Records queued to [`end_records`] and not yet taken by Redis (or given up).
    ending: AtomicUsize,
    ends: mpsc::UnboundedSender<Record>,
    /// The longest lease the routes give a write, in ms, as last configured.
    configured_ms: AtomicU64,
    /// The longest lease this process gave a write, in ms: a reload that
    /// shortened the routes' timeouts leaves older writes with longer ones.
    given_ms: AtomicU64,
}

impl Flights {
    /// For the replica named `replica`; the receiver is [`end_records`]'s.
    pub fn new(replica: String) -> (Flights, mpsc::UnboundedReceiver<Record>) {
        let (ends, ended) = mpsc::unbounded_channel();
        let flights = Flights {
            replica,
            next: AtomicU64::new(0),
            ending: AtomicUsize::new(0),
            ends,
            configured_ms: AtomicU64::new(0),
            given_ms: AtomicU64::new(0),
        };
        (flights, ended)
    }

    /// The member naming the next write's record, unlike any other
    /// replica's (their names are random) or this one's.
    pub fn next_member(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.replica)
    }

    /// The lease in Redis of a write its route gives `lease`: with the wait
    /// for the replicas before the decision answers (`replica_wait`) and
    /// [`LEASE_MARGIN`]. Remembered, for the hold after a confirmation.
    pub fn give(&self, lease: Duration, replica_wait: Duration) -> Duration {
        let lease = lease + replica_wait + LEASE_MARGIN;
        self.given_ms.fetch_max(millis(lease), Ordering::Relaxed);
        lease
    }

    /// The longest lease this process gave a write.
    pub fn longest_given(&self) -> Duration {
        Duration::from_millis(self.given_ms.load(Ordering::Relaxed))
    }

    /// The longest lease the routes give a write now.
    pub fn configure(&self, longest: Duration) {
        self.configured_ms.store(millis(longest), Ordering::Relaxed);
    }

    pub fn configured(&self) -> Duration {
        Duration::from_millis(self.configured_ms.load(Ordering::Relaxed))
    }

    /// Queues the record of a write whose turn ended for [`end_records`].
    pub fn end(&self, record: Record) {
        self.ending.fetch_add(1, Ordering::AcqRel);
        // The task is gone only when the store is: the lease ends the record.
        if self.ends.send(record).is_err() {
            self.ending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Records queued and not yet taken by Redis.
    pub fn ending(&self) -> usize {
        self.ending.load(Ordering::Acquire)
    }

    fn ended(&self, records: usize) {
        self.ending.fetch_sub(records, Ordering::AcqRel);
    }
}

/// A fenced write recorded in flight in Redis; its end queues the record's
/// removal.
pub(super) struct Flight {
    pub inner: Arc<Inner>,
    pub record: Record,
}

impl std::fmt::Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flight").field("member", &self.record.member).finish_non_exhaustive()
    }
}

impl WriteRecord for Flight {
    fn end(self: Box<Self>) {
        let Flight { inner, record } = *self;
        inner.flights.end(record);
    }
}

/// When a batch Redis did not take is sent again, and when it is given up.
#[derive(Debug)]
struct Retry {
    failing_since: Option<Instant>,
    pause: Duration,
}

/// What to do with a batch Redis did not take.
#[derive(Debug, PartialEq, Eq)]
enum AfterFailure {
    /// Send it again after the pause.
    Again(Duration),
    /// Give it up (its records end with their leases), then pause.
    GiveUp(Duration),
}

impl Retry {
    fn new() -> Retry {
        Retry { failing_since: None, pause: END_PAUSE.0 }
    }

    fn succeeded(&mut self) {
        self.failing_since = None;
        self.pause = END_PAUSE.0;
    }

    /// A send failed at `now`.
    fn failed(&mut self, now: Instant) -> AfterFailure {
        let since = *self.failing_since.get_or_insert(now);
        let pause = self.pause;
        self.pause = (self.pause * 2).min(END_PAUSE.1);
        if now.duration_since(since) > END_RETRIES_FOR {
            self.failing_since = None;
            AfterFailure::GiveUp(pause)
        } else {
            AfterFailure::Again(pause)
        }
    }
}

/// Ends the records of writes whose turns ended, as many as have queued in
/// one pipeline: under load, one write to Redis for many of them. A batch
/// Redis did not take (it was down) is sent again, with backoff, for up to
/// [`END_RETRIES_FOR`]: a record left behind would hold every other
/// replica's raise of its key until its lease ends.
pub(super) async fn end_records(inner: Weak<Inner>, mut ended: mpsc::UnboundedReceiver<Record>) {
    let mut batch = Vec::new();
    let mut retry = Retry::new();
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
        for Record { flight, member } in &batch {
            pipe.cmd("ZREM").arg(flight).arg(member).ignore();
        }
        let mut con = inner.con.clone();
        let sent = Instant::now();
        let answer = tokio::time::timeout(inner.timeout, pipe.query_async::<()>(&mut con)).await;
        let error = match inner.answered(answer, sent, "ending writes' records") {
            Ok(()) => {
                inner.flights.ended(batch.len());
                batch.clear();
                retry.succeeded();
                continue;
            }
            Err(e) => e,
        };
        let pause = match retry.failed(Instant::now()) {
            AfterFailure::Again(pause) => pause,
            AfterFailure::GiveUp(pause) => {
                warn!(error = %error, records = batch.len(), "records of writes in the Redis fence store stay until their leases end");
                inner.flights.ended(batch.len());
                batch.clear();
                pause
            }
        };
        drop(inner);
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_the_replica_and_a_count_so_no_two_writes_share_one() {
        let (flights, _ended) = Flights::new("r1".into());
        assert_eq!(flights.next_member(), "r1:0");
        assert_eq!(flights.next_member(), "r1:1");
        let (other, _ended) = Flights::new("r2".into());
        assert_ne!(other.next_member(), "r1:0");
    }

    #[test]
    fn a_lease_in_redis_adds_the_replica_wait_and_the_margin_and_the_longest_is_kept() {
        let (flights, _ended) = Flights::new("r".into());
        let s = Duration::from_secs;
        assert_eq!(flights.give(s(30), Duration::ZERO), s(31));
        assert_eq!(flights.give(s(10), s(2)), s(13));
        // A later, shorter lease leaves the longest given.
        assert_eq!(flights.longest_given(), s(31));
        flights.configure(s(7));
        assert_eq!(flights.configured(), s(7));
        assert_eq!(flights.longest_given(), s(31));
    }

    #[test]
    fn ended_records_are_counted_until_taken_and_not_once_nothing_can_take_them() {
        let (flights, mut ended) = Flights::new("r".into());
        let record = |n: u64| Record { flight: "p:flight:/a".into(), member: format!("r:{n}") };
        flights.end(record(0));
        flights.end(record(1));
        assert_eq!(flights.ending(), 2);
        assert_eq!(ended.try_recv().unwrap(), record(0));
        flights.ended(2);
        assert_eq!(flights.ending(), 0);
        // The task that ends records is gone: nothing waits for them at close.
        drop(ended);
        flights.end(record(2));
        assert_eq!(flights.ending(), 0);
    }

    #[test]
    fn a_batch_redis_did_not_take_is_retried_with_backoff_then_given_up() {
        let mut retry = Retry::new();
        let start = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(retry.failed(start), AfterFailure::Again(ms(50)));
        assert_eq!(retry.failed(start + ms(50)), AfterFailure::Again(ms(100)));
        for _ in 0..10 {
            retry.failed(start + ms(200));
        }
        assert_eq!(retry.failed(start + ms(300)), AfterFailure::Again(ms(2000)), "the pause stops growing");
        assert_eq!(retry.failed(start + END_RETRIES_FOR + ms(1)), AfterFailure::GiveUp(ms(2000)));
        // The next failure starts a new count; a success starts the pauses over.
        assert_eq!(retry.failed(start + END_RETRIES_FOR * 2), AfterFailure::Again(ms(2000)));
        retry.succeeded();
        assert_eq!(retry.failed(start + END_RETRIES_FOR * 3), AfterFailure::Again(ms(50)));
    }
}
