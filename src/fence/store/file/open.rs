//! Opening the store: the database file, journal recovery, and the threads
//! that run it. Refusing to start is the safe answer to anything unexpected,
//! because starting without fences lets stale writers through.

// redb's error type is large; these results are start-up's, never a request's.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};

use redb::{Database, DatabaseError, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageError};
use tokio::sync::Semaphore;

use super::cache::{Sweeper, MAX_READERS};
use super::commit::{Committer, Queue};
use super::fold::{fold, set_clean, Folder, Unfolded};
use super::journal::{self, Journal, Marks};
use super::upgrade;
use super::{CacheBounds, FileStore, Inner, Tuning, CLEAN, DB_FILE, FENCES, META};
use crate::fence::store::{CommitStats, LocalLeases};
use crate::fence::KeyMap;

/// redb's own page cache. The mark cache in front of it does the heavy lifting.
pub(super) const DISK_CACHE_BYTES: usize = 16 << 20;
/// Room for a batch past `fold_bytes` in a journal file's first allocation.
const JOURNAL_SLACK_BYTES: u64 = 256 << 10;
/// The store's threads: commit, fold and sweep.
pub(super) const THREADS: u32 = 3;

/// Why the store could not be opened; fencegate refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "fence store {0} does not exist and [fences] require_existing = true: refusing to start without fences \
         (mount the volume that holds it, or set require_existing = false to start empty on purpose)"
    )]
    Missing(PathBuf),
    #[error("cannot create the fence store directory {path}: {source}")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("fence store {0} is open in another process (is another fencegate running on the same path?)")]
    InUse(PathBuf),
    #[error(
        "fence store {path} is unreadable or corrupt ({detail}): refusing to start without its fences. \
         Restore it from a backup; only move it away if starting with no fences is really what you want"
    )]
    Corrupt { path: PathBuf, detail: String },
    /// A store in the file format fencegate 0.1 wrote that could not be
    /// copied into the current one.
    #[error(
        "fence store {path} is in the file format fencegate 0.1 wrote and could not be upgraded ({detail}): \
         refusing to start. Its fences are as they were, and the next start upgrades it again: fix the cause \
         and start again"
    )]
    Upgrade { path: PathBuf, detail: String },
    /// A journal file holds damage a torn write can't explain.
    #[error(
        "fence store {path} is unreadable or corrupt ({source}): refusing to start without its fences. \
         Restore it from a backup; only move it away if starting with no fences is really what you want"
    )]
    Replay { path: PathBuf, source: journal::ReplayError },
    #[error("cannot use the fence journal {path}: {source}")]
    Journal { path: PathBuf, source: std::io::Error },
    #[error(
        "fence journal {path} is missing, and {db} was not stopped cleanly, so marks raised since its last fold \
         are only in the journal: refusing to start without them. Restore the store directory as a whole; to \
         start from {db} alone, accepting that recent fences may be lost, create the missing file empty"
    )]
    JournalMissing { path: PathBuf, db: PathBuf },
    #[error("cannot start the fence store's {name} thread: {source}")]
    Thread { name: &'static str, source: std::io::Error },
}

impl FileStore {
    /// Opens (or, unless `require_existing`, creates) the store in directory
    /// `dir`, replays its journal, and starts its commit, fold and sweep
    /// threads. Needs no runtime; blocks on disk I/O while it recovers.
    /// Its cache holds about `cache_keys` marks, however many bytes they take.
    pub fn open(dir: &Path, require_existing: bool, cache_keys: usize) -> Result<FileStore, OpenError> {
        FileStore::open_with(dir, require_existing, CacheBounds::keys(cache_keys))
    }

    /// [`open`](Self::open), with the cache bounded in keys and in bytes.
    pub fn open_with(dir: &Path, require_existing: bool, cache: CacheBounds) -> Result<FileStore, OpenError> {
        FileStore::open_tuned_with(dir, require_existing, cache, Tuning::default())
    }

    #[cfg(test)]
    pub(super) fn open_tuned(
        dir: &Path,
        require_existing: bool,
        cache_keys: usize,
        tuning: Tuning,
    ) -> Result<FileStore, OpenError> {
        FileStore::open_tuned_with(dir, require_existing, CacheBounds::keys(cache_keys), tuning)
    }

    pub(super) fn open_tuned_with(
        dir: &Path,
        require_existing: bool,
        cache: CacheBounds,
        tuning: Tuning,
    ) -> Result<FileStore, OpenError> {
        let file = dir.join(DB_FILE);
        // An empty file is no store: a first start that crashed before its first
        // commit leaves one, and so does a copy that went wrong.
        let exists = std::fs::metadata(&file).map(|m| m.len() > 0).unwrap_or(false);
        if !exists {
            if require_existing {
                return Err(OpenError::Missing(file));
            }
            std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir { path: dir.to_path_buf(), source })?;
        }
        let corrupt = |detail: String| OpenError::Corrupt { path: file.clone(), detail };
        let db = open_database(&file)?;
        // Create the tables once, so readers never meet a missing table, and
        // read how the last process stopped.
        let was_clean = (|| -> Result<bool, redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(FENCES)?;
            let was_clean = txn.open_table(META)?.get(CLEAN)?.is_none_or(|v| v.value() == 1);
            txn.commit()?;
            Ok(was_clean)
        })()
        .map_err(|e| corrupt(e.to_string()))?;
        if !was_clean {
            for name in journal::FILES {
                let path = dir.join(name);
                if !path.exists() {
                    return Err(OpenError::JournalMissing { path, db: file });
                }
            }
        }
        // Holding the database's lock, bring the B-tree up to date with the journal.
        let replayed = recover_journal(&db, dir, was_clean)?;
        let recovered = (|| -> Result<u64, redb::Error> { Ok(db.begin_read()?.open_table(FENCES)?.len()?) })()
            .map_err(|e| corrupt(e.to_string()))?;
        // Both files are folded now: empty them. Appends up to a fold's worth
        // (and a batch) land in blocks that are already written.
        let journal = Journal::open(dir, tuning.fold_bytes + JOURNAL_SLACK_BYTES)
            .map_err(|(path, source)| OpenError::Journal { path, source })?;
        // Only now, with both journal files in place and before the first
        // append: until a clean stop, the journal holds marks the B-tree may lack.
        if was_clean {
            set_clean(&db, false).map_err(|e| corrupt(e.to_string()))?;
        }
        tracing::info!(path = %file.display(), fences = recovered, replayed, "fence store opened");
        start(db, file, journal, recovered, cache, tuning)
    }
}

/// Opens the database file, telling a file in use from a damaged one. A
/// store in the file format fencegate 0.1 wrote is upgraded first ([`upgrade`]).
fn open_database(file: &Path) -> Result<Database, OpenError> {
    match try_open(file)? {
        Err(DatabaseError::UpgradeRequired(upgrade::OLD_FORMAT)) => {
            upgrade::from_v2(file)?;
            try_open(file)?.map_err(|e| open_failed(file, e))
        }
        opened => opened.map_err(|e| open_failed(file, e)),
    }
}

fn try_open(file: &Path) -> Result<Result<Database, DatabaseError>, OpenError> {
    // redb panics instead of returning an error on some damaged files (one
    // shorter or longer than its header says): report those as corrupt too.
    std::panic::catch_unwind(|| Database::builder().set_cache_size(DISK_CACHE_BYTES).create(file)).map_err(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the store library panicked while opening it");
        OpenError::Corrupt { path: file.to_path_buf(), detail: detail.to_string() }
    })
}

fn open_failed(file: &Path, e: DatabaseError) -> OpenError {
    let corrupt = |detail: String| OpenError::Corrupt { path: file.to_path_buf(), detail };
    match e {
        DatabaseError::DatabaseAlreadyOpen => OpenError::InUse(file.to_path_buf()),
        DatabaseError::Storage(StorageError::Io(io)) if io.kind() == std::io::ErrorKind::WouldBlock => {
            OpenError::InUse(file.to_path_buf())
        }
        DatabaseError::UpgradeRequired(format) => corrupt(format!(
            "its header says file format v{format}: fencegate reads v3 and upgrades v{} (fencegate 0.1's) at start",
            upgrade::OLD_FORMAT
        )),
        other => corrupt(other.to_string()),
    }
}

/// Replays both journal files into the B-tree, at start-up. Returns how many
/// records were replayed. `was_clean`: the last process stopped cleanly, so
/// the B-tree holds every mark already.
fn recover_journal(db: &Database, dir: &Path, was_clean: bool) -> Result<u64, OpenError> {
    let mut marks = Marks::default();
    let mut records = 0;
    for name in journal::FILES {
        let path = dir.join(name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(OpenError::Journal { path, source }),
        };
        if bytes.is_empty() {
            warn_empty_journal(&path, &dir.join(DB_FILE), was_clean);
        }
        let replayed =
            journal::replay(&bytes, &mut marks).map_err(|source| OpenError::Replay { path: path.clone(), source })?;
        tracing::debug!(path = %path.display(), records = replayed.records, end = replayed.end, "journal replayed");
        records += replayed.records;
    }
    // As at opening: a panic inside the store library is a damaged file, not a crash.
    let detail = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fold(db, &marks))) {
        Ok(Ok(())) => return Ok(records),
        Ok(Err(e)) => format!("folding the journal into the fence store: {e}"),
        Err(_) => "the store library panicked while replaying the journal".to_string(),
    };
    Err(OpenError::Corrupt { path: dir.join(DB_FILE), detail })
}

/// Says what a zero-byte journal file means. fencegate never leaves one (it
/// writes each journal file whole under another name and renames it into
/// place), so it was emptied by hand, as the way out of a missing journal,
/// or a crash of the machine lost what the filesystem had not yet written.
fn warn_empty_journal(path: &Path, db: &Path, was_clean: bool) {
    let consequence = if was_clean {
        "the last stop was clean, so the store file holds every mark and nothing is lost"
    } else {
        "the last stop was not clean: marks raised since the last fold that were only in this file are lost, and          a stale lock holder of those keys may write again; restore the store directory from a backup if that          matters"
    };
    tracing::warn!(
        path = %path.display(),
        clean_stop = was_clean,
        "fence journal {} is empty (zero bytes): fencegate never leaves one, so it was emptied by hand or a crash          of the machine lost its contents. It holds no marks: the store starts from {} and the other journal file,          and writes this one afresh; {consequence}",
        path.display(),
        db.display()
    );
}

/// Starts the store's threads on a recovered database.
fn start(
    db: Database,
    path: PathBuf,
    journal: Journal,
    recovered: u64,
    cache: CacheBounds,
    tuning: Tuning,
) -> Result<FileStore, OpenError> {
    let db = Arc::new(db);
    let stats = Arc::new(CommitStats::default());
    let queue = Arc::new(Queue::default());
    let unfolded = Arc::new(Mutex::new(Unfolded::default()));
    let ended = Arc::new(Semaphore::new(0));
    let (jobs, job_rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let folder = Folder { db: db.clone(), queue: queue.clone(), stats: stats.clone(), unfolded: unfolded.clone() };
    let committer = Committer {
        db: db.clone(),
        queue: queue.clone(),
        stats: stats.clone(),
        unfolded: unfolded.clone(),
        journal,
        tuning,
        folding: false,
        concurrent: false,
        fold_stuck: false,
        jobs,
        done,
    };
    spawn("fold", &ended, move || folder.run(job_rx, done_tx))?;
    spawn("commit", &ended, move || committer.run())?;
    let sweeper = Arc::new(Sweeper::default());
    let inner = Arc::new(Inner {
        db,
        path,
        cache: KeyMap::default(),
        capacity: cache.keys.max(1),
        max_cached_bytes: cache.bytes.max(1),
        cached_bytes: AtomicU64::new(0),
        turns: Arc::new(tokio::sync::RwLock::new(())),
        turn_wait: tuning.turn_wait,
        evictions: AtomicU64::new(0),
        tracked: Arc::new(AtomicU64::new(recovered)),
        stats,
        unfolded,
        sweeper: sweeper.clone(),
        readers: Semaphore::new(MAX_READERS),
        leases: LocalLeases::default(),
    });
    let weak = Arc::downgrade(&inner);
    // Built before the last thread starts: if it can't, dropping the store stops the others.
    let store = FileStore { inner, queue, reopened: recovered > 0, ended: ended.clone() };
    spawn("sweep", &ended, move || sweeper.run(weak))?;
    Ok(store)
}

/// Starts one of the store's threads; it gives a permit back to `ended`
/// however it ends (a closure that never ran included).
fn spawn(name: &'static str, ended: &Arc<Semaphore>, run: impl FnOnce() + Send + 'static) -> Result<(), OpenError> {
    let ended = Ended(ended.clone());
    std::thread::Builder::new()
        .name(format!("fencegate-{name}"))
        .spawn(move || {
            let _ended = ended;
            run();
        })
        .map(drop)
        .map_err(|source| OpenError::Thread { name, source })
}

struct Ended(Arc<Semaphore>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}
