//! Folding: the fold thread writes a full journal file's marks into the B-tree
//! in one transaction, then empties the file; until then the marks stay in
//! memory ([`Unfolded`]), where reads look before the B-tree.

// redb's error type is large; these results travel between blocking threads,
// never through the request hot path.
#![allow(clippy::result_large_err)]

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use redb::Database;

use super::commit::Queue;
use super::journal::{self, JournalFile, Marks};
use super::{lock, CLEAN, FENCES, META};
use crate::fence::store::CommitStats;

/// How long a failed fold, or a failed emptying of a folded file, waits before
/// it is tried again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Marks that are in the journal and not yet in the B-tree.
///
/// A reader looks here before it reads the B-tree, and the fold thread removes
/// marks from here only after its transaction is durable: whichever way a read
/// and a fold interleave, the read sees every journaled mark.
#[derive(Debug, Default)]
pub(super) struct Unfolded {
    /// Appended since the journal last rotated.
    pub(super) current: Marks,
    /// Handed to the fold thread and not folded yet.
    pub(super) folding: Arc<Marks>,
}

impl Unfolded {
    pub(super) fn mark(&self, key: &str) -> Option<u64> {
        self.current.get(key).max(self.folding.get(key)).copied()
    }

    /// Up to `limit` marks whose keys start with `prefix` and sort after `after`,
    /// in key order, each key once with its highest mark. Reads at most `limit`
    /// marks of each map (a range of each), so the commit thread, which takes
    /// this lock after every append, never waits for a listing to walk them all.
    pub(super) fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<(String, u64)> {
        use std::ops::Bound;
        let from = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut first = Marks::new();
        for marks in [&self.current, &*self.folding] {
            let range = marks.range::<str, _>((from, Bound::Unbounded));
            for (key, token) in range.take_while(|(key, _)| key.starts_with(prefix)).take(limit) {
                journal::raise(&mut first, key, *token);
            }
        }
        first.into_iter().take(limit).map(|(key, token)| (key.into(), token)).collect()
    }
}

/// A full journal file and the marks in it.
pub(super) struct FoldJob {
    pub(super) marks: Arc<Marks>,
    pub(super) file: Arc<JournalFile>,
}

/// The fold thread: writes a full journal file's marks into the B-tree in one
/// transaction (fsync'd), then forgets them and empties the file.
pub(super) struct Folder {
    pub(super) db: Arc<Database>,
    pub(super) queue: Arc<Queue>,
    pub(super) stats: Arc<CommitStats>,
    pub(super) unfolded: Arc<Mutex<Unfolded>>,
}

impl Folder {
    pub(super) fn run(self, jobs: mpsc::Receiver<FoldJob>, done: mpsc::Sender<()>) {
        self.fold_all(jobs, done);
        // The commit thread has ended. If everything it journaled is folded, the
        // B-tree alone holds every mark: say so, for the next start.
        let unfolded = lock(&self.unfolded);
        if unfolded.current.is_empty() && unfolded.folding.is_empty() {
            drop(unfolded);
            if let Err(e) = set_clean(&self.db, true) {
                crate::telemetry::warn_limited!(error = %e, "cannot record the clean stop; the next start replays the journal");
            }
        }
    }

    fn fold_all(&self, jobs: mpsc::Receiver<FoldJob>, done: mpsc::Sender<()>) {
        for job in jobs {
            while let Err(e) = fold(&self.db, &job.marks) {
                // Nothing is lost: the journal file and the marks in memory stay
                // until a fold succeeds.
                self.stats.fold_failures.inc();
                crate::telemetry::error_limited!(error = %e, marks = job.marks.len(), "folding the fence journal failed; retrying");
                if self.queue.lock().stopping() {
                    return;
                }
                std::thread::sleep(RETRY_EVERY);
            }
            self.stats.folds.inc();
            lock(&self.unfolded).folding = Arc::default();
            if let Err(e) = job.file.empty() {
                // Harmless: its marks are folded, and replaying them again changes
                // nothing. Appends to it wait for the next successful emptying.
                crate::telemetry::warn_limited!(error = %e, "cannot empty a folded journal file");
                while job.file.empty().is_err() {
                    if self.queue.lock().stopping() {
                        return;
                    }
                    std::thread::sleep(RETRY_EVERY);
                }
            }
            if done.send(()).is_err() {
                return;
            }
        }
    }
}

/// Records whether the B-tree alone holds every mark (a clean stop) or the
/// journal may hold more (a process has the store open).
pub(super) fn set_clean(db: &Database, clean: bool) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(META)?.insert(CLEAN, u64::from(clean))?;
    txn.commit()?;
    Ok(())
}

/// Writes each mark as `max(in the B-tree, mark)` in one transaction: a mark in
/// the B-tree never goes back, whatever order folds happen in.
pub(super) fn fold(db: &Database, marks: &Marks) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(FENCES)?;
        // In key order: each leaf page is visited once, in turn.
        for (key, token) in marks {
            // One lookup: insert, and put the old mark back in the rare case it was higher.
            let old = table.insert(&**key, *token)?.map(|v| v.value());
            if let Some(old) = old.filter(|old| old > token) {
                table.insert(&**key, old)?;
            }
        }
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::store::file::cache::list_marks;

    fn marks(pairs: &[(&str, u64)]) -> Marks {
        pairs.iter().map(|(k, t)| ((*k).into(), *t)).collect()
    }

    #[test]
    fn unfolded_marks_list_each_key_once_with_its_highest_mark() {
        let unfolded = Unfolded {
            current: marks(&[("a", 2), ("b", 1), ("d", 4), ("x", 9)]),
            folding: Arc::new(marks(&[("a", 5), ("c", 3), ("b", 0)])),
        };
        let all = [("a", 5), ("b", 1), ("c", 3), ("d", 4)].map(|(k, t)| (k.to_string(), t));
        assert_eq!(unfolded.list("", None, 4), [&all[..], &[("x".to_string(), 9)]].concat()[..4]);
        assert_eq!(unfolded.list("", None, 2), all[..2]);
        assert_eq!(unfolded.list("", Some("a"), 2), all[1..3]);
        assert_eq!(unfolded.list("c", None, 10), all[2..3]);
        assert_eq!(unfolded.mark("a"), Some(5));
        assert_eq!(unfolded.mark("z"), None);
        // A cursor before the prefix starts at the prefix; one past it ends the list.
        assert_eq!(unfolded.list("c", Some("a"), 10), all[2..3]);
        assert_eq!(unfolded.list("b", Some("c"), 10), []);
        // Keys only in the folding map, after the first `limit` of the current one.
        let unfolded = Unfolded {
            current: marks(&[("p1", 1), ("p2", 1), ("p3", 1)]),
            folding: Arc::new(marks(&[("p0", 7), ("p2", 8), ("q", 1)])),
        };
        let page = |after, limit| unfolded.list("p", after, limit);
        assert_eq!(page(None, 2), [("p0".to_string(), 7), ("p1".to_string(), 1)]);
        assert_eq!(page(Some("p1"), 2), [("p2".to_string(), 8), ("p3".to_string(), 1)]);
        assert_eq!(page(Some("p3"), 2), []);
    }

    #[test]
    fn a_lower_mark_folded_after_a_higher_one_never_lowers_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("fences.redb")).unwrap();
        fold(&db, &marks(&[("k", 7)])).unwrap();
        fold(&db, &marks(&[("k", 6), ("j", 1)])).unwrap();
        assert_eq!(list_marks(&db, "", None, 10).unwrap(), [("j".into(), 1), ("k".into(), 7)]);
    }
}
