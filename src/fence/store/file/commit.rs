//! Group commit: raises queue for one commit thread, which appends everything
//! queued as one journal frame with one fsync and answers the whole batch at
//! once; full journal files go to the fold thread. Deletes queue here too, so
//! they are ordered with the raises (see [`super::delete`]).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use redb::Database;

use super::delete::DeleteJob;
use super::fold::{FoldJob, Unfolded};
use super::journal::{self, Journal};
use super::relay::Relay;
use super::{lock, FileStore, Tuning};
use crate::fence::store::{CommitStats, StoreError};

/// Raises on their way to the commit thread.
///
/// Handing a raise over costs a push under a mutex; the commit thread is woken
/// only when it was idle, and it answers a whole batch at once: everyone in a
/// batch waits on the same [`Batch`], not on a channel of their own.
#[derive(Debug, Default)]
pub(super) struct Queue {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// Times the commit thread waited for a fold to empty the journal.
    #[cfg(test)]
    pub(super) fold_waits: std::sync::atomic::AtomicU64,
    /// Times the commit thread took deletes off the queue.
    #[cfg(test)]
    pub(super) deletes_taken: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Keys and tokens for the next commit.
    frame: journal::Frame,
    /// Where the next commit's outcome will be posted.
    batch: Arc<Batch>,
    /// Deletes, done after the raises queued before them are committed.
    pub(super) deletes: Vec<DeleteJob>,
    /// The commit thread is waiting for work.
    idle: bool,
    /// The store is closing: no new raises; the commit thread writes what is
    /// queued and ends.
    closing: bool,
    /// The commit thread has ended.
    ended: bool,
}

impl Pending {
    /// Whether raises are queued for the next commit.
    #[cfg(test)]
    pub(super) fn has_raises(&self) -> bool {
        !self.frame.is_empty()
    }

    /// Whether the store's threads should give up what they are retrying.
    pub(super) fn stopping(&self) -> bool {
        self.closing || self.ended
    }

    /// Why no more work is taken, if none is.
    pub(super) fn refusal(&self) -> Option<StoreError> {
        if self.closing {
            Some(StoreError::Closing)
        } else if self.ended {
            Some(StoreError::CommitterStopped)
        } else {
            None
        }
    }
}

impl Queue {
    pub(super) fn lock(&self) -> MutexGuard<'_, Pending> {
        lock(&self.pending)
    }

    /// Wakes the commit thread if it is waiting for work.
    pub(super) fn wake(&self) {
        let mut pending = self.lock();
        if pending.idle {
            pending.idle = false;
            self.wake.notify_one();
        }
    }

    /// Refuses new raises and tells the commit thread to finish.
    pub(super) fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }
}

/// The outcome of one commit, posted once for every raise in it.
#[derive(Debug, Default)]
pub(super) struct Batch {
    outcome: OnceLock<Result<(), StoreError>>,
    /// Waiters on runtimes without a [`Relay`] wait here.
    posted: Notify,
    /// The relays of the worker threads with waiters.
    relays: Mutex<Vec<Arc<Relay>>>,
}

impl Batch {
    pub(super) async fn outcome(&self) -> Result<(), StoreError> {
        let Some(relay) = Relay::current() else {
            return self.outcome_without_relay().await;
        };
        {
            let mut relays = lock(&self.relays);
            if !relays.iter().any(|r| Arc::ptr_eq(r, &relay)) {
                relays.push(relay.clone());
            }
        }
        // Registered with the relay before looking (see `post`); the relay wakes
        // every waiter of this thread, for whichever commit, so look again.
        loop {
            let woken = relay.local().notified();
            if let Some(outcome) = self.outcome.get() {
                return outcome.clone();
            }
            woken.await;
        }
    }

    async fn outcome_without_relay(&self) -> Result<(), StoreError> {
        let posted = self.posted.notified();
        tokio::pin!(posted);
        // Registered before looking, so a post in between still wakes us.
        posted.as_mut().enable();
        if let Some(outcome) = self.outcome.get() {
            return outcome.clone();
        }
        posted.await;
        self.outcome.get().cloned().unwrap_or(Err(StoreError::CommitterStopped))
    }

    fn post(&self, outcome: Result<(), StoreError>) {
        let _ = self.outcome.set(outcome);
        self.posted.notify_waiters();
        // A waiter that registers its relay after this lock looks at the
        // outcome after it, and finds it set.
        let relays = std::mem::take(&mut *lock(&self.relays));
        for relay in relays {
            relay.signal();
        }
    }
}

impl FileStore {
    /// Queues a raise for the committer; its outcome is posted on the batch returned.
    pub(super) fn queue_raise(&self, key: &str, token: u64) -> Result<Arc<Batch>, StoreError> {
        let mut pending = self.queue.lock();
        if pending.closing {
            return Err(StoreError::Closing);
        }
        if pending.ended {
            return Err(StoreError::CommitterStopped);
        }
        pending
            .frame
            .push(key, token)
            .map_err(|e| StoreError::Io { context: "cannot journal the raise", source: Arc::new(e) })?;
        if pending.idle {
            pending.idle = false;
            self.queue.wake.notify_one();
        }
        Ok(pending.batch.clone())
    }
}

/// The commit thread: takes everything queued, appends it to the journal as one
/// frame (one fsync), posts the outcome to everyone in the batch, repeats; and
/// hands full journal files to the fold thread.
pub(super) struct Committer {
    /// For deletes, which change the B-tree directly.
    pub(super) db: Arc<Database>,
    pub(super) queue: Arc<Queue>,
    pub(super) stats: Arc<CommitStats>,
    pub(super) unfolded: Arc<Mutex<Unfolded>>,
    pub(super) journal: Journal,
    pub(super) tuning: Tuning,
    /// A journal file is with the fold thread, which says on `done` when it is empty again.
    pub(super) folding: bool,
    /// The last batch held more than one raise.
    pub(super) concurrent: bool,
    /// A wait for the fold in progress ran out; it has not ended since.
    pub(super) fold_stuck: bool,
    pub(super) jobs: mpsc::Sender<FoldJob>,
    pub(super) done: mpsc::Receiver<()>,
}

impl Committer {
    pub(super) fn run(mut self) {
        let queue = self.queue.clone();
        // However this thread ends, nobody is left waiting for it.
        let _ended = EndOnExit(&queue);
        let mut frame = journal::Frame::default();
        while let Some(work) = self.next_batch(&mut frame) {
            let batch = match work {
                Work::Commit(batch) => batch,
                Work::Delete(jobs) => {
                    for job in jobs {
                        // Nobody waits for it (the runtime it was asked on is
                        // gone): its turns are released, so raises may have
                        // passed it; running it now could wipe their marks.
                        if job.reply.is_closed() {
                            continue;
                        }
                        let result = self.delete(&job.which);
                        let _ = job.reply.send(result);
                    }
                    continue;
                }
            };
            let started = Instant::now();
            let count = frame.records();
            let result = self.commit(&mut frame);
            match &result {
                Ok(()) => {
                    self.stats.commits.inc();
                    self.stats.raises.inc_by(count);
                    self.stats.commit_seconds.observe(started.elapsed().as_secs_f64());
                    self.stats.failing.store(false, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.failures.inc();
                    self.stats.failing.store(true, Ordering::Relaxed);
                    crate::telemetry::error_limited!(error = %e, raises = count, "fence store commit failed");
                }
            }
            batch.post(result);
            frame.clear();
            let fold_bytes = self.tuning.fold_bytes;
            self.fold_if(|len| len >= fold_bytes);
        }
        // Closing: fold what is left, so the next start has little to replay.
        if self.folding && self.done.recv_timeout(self.tuning.fold_wait).is_ok() {
            self.folding = false;
        }
        self.fold_if(|len| len > 0);
    }

    /// Waits for raises and swaps their frame with `frame` (empty, its buffer
    /// reused), or for deletes, raises first; `None` once the store is closing
    /// and nothing is queued.
    fn next_batch(&mut self, frame: &mut journal::Frame) -> Option<Work> {
        let queue = self.queue.clone();
        let mut pending = queue.lock();
        loop {
            if !pending.frame.is_empty() {
                if self.concurrent && !self.tuning.commit_delay.is_zero() {
                    // Writers are raising concurrently: give more of them the
                    // time to join this commit, so that each pays a smaller share.
                    drop(pending);
                    std::thread::sleep(self.tuning.commit_delay);
                    pending = queue.lock();
                }
                std::mem::swap(&mut pending.frame, frame);
                self.concurrent = frame.records() > 1;
                return Some(Work::Commit(PostOnExit(Some(std::mem::take(&mut pending.batch)))));
            }
            if !pending.deletes.is_empty() {
                #[cfg(test)]
                self.queue.deletes_taken.fetch_add(1, Ordering::SeqCst);
                return Some(Work::Delete(std::mem::take(&mut pending.deletes)));
            }
            if pending.closing {
                return None;
            }
            pending.idle = true;
            let (next, waited) =
                queue.wake.wait_timeout(pending, self.tuning.idle_fold).unwrap_or_else(PoisonError::into_inner);
            pending = next;
            if waited.timed_out() && pending.frame.is_empty() {
                drop(pending);
                self.fold_if(|len| len > 0);
                pending = queue.lock();
            }
        }
    }

    /// Appends `frame` to the journal, durably, and keeps its marks in memory
    /// until they are folded.
    fn commit(&mut self, frame: &mut journal::Frame) -> Result<(), StoreError> {
        self.poll_fold();
        if self.folding && self.journal.frame_bytes() >= self.tuning.max_journal_bytes {
            // The fold thread has fallen behind: wait for it rather than let the
            // journal grow without bound, then start on the file it emptied.
            // Once a wait has run out, later batches fail at once until the fold
            // ends, so no raise waits more than `fold_wait`.
            let wait = if self.fold_stuck { Duration::ZERO } else { self.tuning.fold_wait };
            #[cfg(test)]
            if !wait.is_zero() {
                self.queue.fold_waits.fetch_add(1, Ordering::SeqCst);
            }
            self.await_fold(wait)?;
            self.fold_if(|_| true);
        }
        self.journal.append(frame).map_err(|e| match e.kind() {
            io::ErrorKind::StorageFull => StoreError::DiskFull(Arc::new(e)),
            _ => StoreError::Io { context: "appending to the fence journal", source: Arc::new(e) },
        })?;
        let mut unfolded = lock(&self.unfolded);
        for record in frame.marks() {
            let (key, token) = record.map_err(|e| StoreError::Io {
                context: "reading back a journal frame",
                source: Arc::new(io::Error::new(io::ErrorKind::InvalidData, e)),
            })?;
            journal::raise(&mut unfolded.current, key, token);
        }
        Ok(())
    }

    fn poll_fold(&mut self) {
        if self.folding {
            match self.done.try_recv() {
                Ok(()) => {
                    self.folding = false;
                    self.fold_stuck = false;
                }
                // A fold thread that is gone never empties its file again: stay
                // "folding", and appends fail once the journal is full.
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
        }
    }

    /// Waits up to `wait` for the fold in progress to finish. A fold that
    /// outlasts it marks the store stuck, so later appends fail at once.
    fn await_fold(&mut self, wait: Duration) -> Result<(), StoreError> {
        match self.done.recv_timeout(wait) {
            Ok(()) => {
                self.folding = false;
                self.fold_stuck = false;
                Ok(())
            }
            Err(RecvTimeoutError::Timeout) => {
                self.fold_stuck = true;
                Err(StoreError::FoldStuck)
            }
            Err(RecvTimeoutError::Disconnected) => Err(StoreError::FoldStopped),
        }
    }

    /// Waits until every journaled mark is in the B-tree and both journal
    /// files are empty: the fold in progress, then one of the file taking
    /// appends. Each wait is bounded like an append's (`fold_wait`).
    pub(super) fn fold_everything(&mut self) -> Result<(), StoreError> {
        for _ in 0..2 {
            if self.folding {
                self.await_fold(self.tuning.fold_wait)?;
            }
            self.fold_if(|len| len > 0);
        }
        Ok(())
    }

    /// Hands the journal file to the fold thread when no fold is in progress and
    /// its length passes `due`; later appends go to the other file.
    fn fold_if(&mut self, due: impl Fn(u64) -> bool) {
        self.poll_fold();
        if self.folding || !due(self.journal.frame_bytes()) {
            return;
        }
        let file = self.journal.rotate();
        // Everything in the full file, and nothing else, is in `current`: both
        // change only on this thread.
        let marks = {
            let mut unfolded = lock(&self.unfolded);
            let marks = Arc::new(std::mem::take(&mut unfolded.current));
            unfolded.folding = marks.clone();
            marks
        };
        self.folding = true;
        let _ = self.jobs.send(FoldJob { marks, file });
    }
}

/// What the commit thread does next.
enum Work {
    Commit(PostOnExit),
    Delete(Vec<DeleteJob>),
}

/// A batch to answer: posts "stopped" if it is dropped unanswered (the commit panicked).
struct PostOnExit(Option<Arc<Batch>>);

impl PostOnExit {
    fn post(mut self, outcome: Result<(), StoreError>) {
        if let Some(batch) = self.0.take() {
            batch.post(outcome);
        }
    }
}

impl Drop for PostOnExit {
    fn drop(&mut self) {
        if let Some(batch) = self.0.take() {
            batch.post(Err(StoreError::CommitterStopped));
        }
    }
}

/// Refuses new raises and answers the queued ones when the commit thread ends.
struct EndOnExit<'a>(&'a Queue);

impl Drop for EndOnExit<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        pending.ended = true;
        pending.frame.clear();
        // Their senders dropped: each delete is answered "stopped".
        pending.deletes.clear();
        pending.batch.post(Err(StoreError::CommitterStopped));
    }
}
