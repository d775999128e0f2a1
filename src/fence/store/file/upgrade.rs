//! Stores written by fencegate 0.1, in redb's file format v2, which the redb
//! fencegate uses now (v3 files) cannot open. At open, such a file is copied
//! into the current format beside it and the copy renamed over it, once.
//!
//! fencegate never changes the old file's fences (opening it, the old redb
//! may only mark it open, or repair it after a crash, as any open does):
//! until the rename, it is the store, as it was; a crash or a failure part
//! way leaves it so, and the next start copies it again. The copy holds every table the old file holds (fencegate
//! 0.1 had two, its marks and the clean-stop flag), entry by entry; a table
//! fencegate does not know stops the upgrade rather than being dropped.

// redb's error types are large; these results are start-up's, never a request's.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use redb::{ReadableTableMetadata, TableHandle};
use redb2::{MultimapTableHandle as _, ReadableTableMetadata as _, TableHandle as _};

use super::open::DISK_CACHE_BYTES;
use super::{OpenError, FENCES, META};

/// The old file format, the one fencegate 0.1 wrote.
pub(super) const OLD_FORMAT: u8 = 2;
/// The copy's name while it is being written, next to the store file.
const COPY_SUFFIX: &str = "upgrading";
/// Entries copied per transaction, so a large store needs no more memory than a small one.
const BATCH: usize = 50_000;

/// Copies the store `file`, written in redb's file format v2, into the
/// current format, and renames the copy over it. Returns how many fences
/// it holds.
pub(super) fn from_v2(named: &Path) -> Result<u64, OpenError> {
    let failed = |detail: String| OpenError::Upgrade { path: named.to_path_buf(), detail };
    // A store file reached through a symlink is upgraded where it is: the
    // rename must replace the file, not the link.
    let resolved = std::fs::canonicalize(named).map_err(|e| failed(format!("finding the file the path names: {e}")))?;
    let file = resolved.as_path();
    let copy = copy_path(file);
    let started = Instant::now();
    // redb panics instead of returning an error on some damaged files.
    let old = std::panic::catch_unwind(|| redb2::Database::builder().set_cache_size(DISK_CACHE_BYTES).open(file))
        .map_err(|_| failed("the old store library panicked while opening it".into()))?
        .map_err(|e| match e {
            redb2::DatabaseError::DatabaseAlreadyOpen => OpenError::InUse(file.to_path_buf()),
            redb2::DatabaseError::Storage(redb2::StorageError::Io(io))
                if io.kind() == std::io::ErrorKind::WouldBlock =>
            {
                OpenError::InUse(file.to_path_buf())
            }
            other => failed(format!("opening it: {other}")),
        })?;
    tracing::info!(
        path = %file.display(),
        "fence store {} is in the file format fencegate 0.1 wrote: copying it into the current format \
         (the file is replaced only once the copy is complete and on disk)",
        file.display()
    );
    // A copy left by an earlier attempt that stopped part way is not the store.
    remove_copy(&copy).map_err(|e| failed(format!("removing the unfinished copy {}: {e}", copy.display())))?;
    let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| copy_into(&old, &copy)))
        .unwrap_or_else(|_| Err(Failure::Old("the old store library panicked while reading it".into())));
    let fences = match copied {
        Ok(fences) => fences,
        Err(failure) => {
            let _ = remove_copy(&copy);
            return Err(failed(failure.to_string()));
        }
    };
    // Renamed while the old file is still open and locked: no fencegate 0.1
    // can open it meanwhile. The copy gets the old file's permissions and
    // owner, so the service's user still opens it after an upgrade that ran
    // as another user (root in a debug shell, say); where that cannot be
    // done, the upgrade is refused rather than leave a file it cannot open.
    let renamed = std::fs::metadata(file)
        .and_then(|old| {
            std::fs::set_permissions(&copy, old.permissions())?;
            same_owner(&copy, &old)
        })
        .and_then(|()| std::fs::rename(&copy, file));
    drop(old);
    if let Err(e) = renamed {
        let _ = remove_copy(&copy);
        return Err(failed(format!(
            "giving the copy {} the old file's mode and owner, and renaming it over it: {e}",
            copy.display()
        )));
    }
    // Refused to start rather than risk the rename being lost with marks
    // written since: the next start finds one file or the other, both whole.
    sync_dir(file).map_err(|e| {
        failed(format!(
            "syncing its directory after the upgraded copy took its place: {e} (the file is upgraded; \
             fencegate starts once the directory can be synced)"
        ))
    })?;
    tracing::info!(
        path = %file.display(),
        fences,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "fence store {} upgraded to the current file format, every fence kept",
        file.display()
    );
    Ok(fences)
}

/// Gives `copy` the owner and group of the old file (`old`).
#[cfg(unix)]
fn same_owner(copy: &Path, old: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mine = std::fs::metadata(copy)?;
    if (mine.uid(), mine.gid()) == (old.uid(), old.gid()) {
        return Ok(());
    }
    std::os::unix::fs::chown(copy, Some(old.uid()), Some(old.gid())).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "the old file belongs to {}:{}, the copy to {}:{} ({e})",
                old.uid(),
                old.gid(),
                mine.uid(),
                mine.gid()
            ),
        )
    })
}

#[cfg(not(unix))]
fn same_owner(_: &Path, _: &std::fs::Metadata) -> std::io::Result<()> {
    Ok(())
}

/// Where the copy of `file` is written.
fn copy_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(COPY_SUFFIX);
    file.with_file_name(name)
}

fn remove_copy(copy: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(copy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn sync_dir(file: &Path) -> std::io::Result<()> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}

/// What went wrong during the copy: reading the old file or writing the new one.
enum Failure {
    Old(String),
    New(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Old(e) => write!(f, "reading it: {e}"),
            Failure::New(e) => write!(f, "writing the copy: {e}"),
        }
    }
}

fn old(e: impl Into<redb2::Error>) -> Failure {
    Failure::Old(e.into().to_string())
}

fn new(e: impl Into<redb::Error>) -> Failure {
    Failure::New(e.into().to_string())
}

/// Writes every entry of `old` into a new database at `copy`, checks that
/// each table holds as many entries as the old one, and closes it (its last
/// commit is on disk). Returns the number of fences.
fn copy_into(old_db: &redb2::Database, copy: &Path) -> Result<u64, Failure> {
    let txn = old_db.begin_read().map_err(old)?;
    let known = [FENCES.name(), META.name()];
    if let Some(table) = txn.list_tables().map_err(old)?.find(|t| !known.contains(&t.name())) {
        return Err(Failure::Old(format!("it holds a table fencegate does not know, {:?}", table.name())));
    }
    if let Some(table) = txn.list_multimap_tables().map_err(old)?.next() {
        return Err(Failure::Old(format!("it holds a table fencegate does not know, {:?}", table.name())));
    }
    let new_db = redb::Database::builder().set_cache_size(DISK_CACHE_BYTES).create(copy).map_err(new)?;
    let mut fences = 0;
    for table in [FENCES, META] {
        let name = table.name();
        let from = match txn.open_table(redb2::TableDefinition::<&str, u64>::new(name)) {
            Ok(from) => Some(from),
            Err(redb2::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(old(e)),
        };
        let mut entries = match &from {
            Some(from) => Some(from.range::<&str>(..).map_err(old)?),
            None => None,
        };
        // At least one transaction, so the table exists in the copy even when empty.
        loop {
            let write = new_db.begin_write().map_err(new)?;
            let mut batch = 0;
            {
                let mut to = write.open_table(table).map_err(new)?;
                while batch < BATCH {
                    let Some(entry) = entries.as_mut().and_then(Iterator::next) else { break };
                    let (key, value) = entry.map_err(old)?;
                    to.insert(key.value(), value.value()).map_err(new)?;
                    batch += 1;
                }
            }
            write.commit().map_err(new)?;
            if batch < BATCH {
                break;
            }
        }
        let expected = from.as_ref().map(|from| from.len()).transpose().map_err(old)?.unwrap_or(0);
        let written = redb::ReadableDatabase::begin_read(&new_db)
            .map_err(new)?
            .open_table(table)
            .map_err(new)?
            .len()
            .map_err(new)?;
        if written != expected {
            return Err(Failure::New(format!(
                "table {name:?} holds {written} entries where the old one holds {expected}"
            )));
        }
        if name == FENCES.name() {
            fences = written;
        }
    }
    new_db.close().map_err(new)?;
    Ok(fences)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fence::store::file::cache::list_marks;
    use crate::fence::store::file::{journal, FileStore, DB_FILE};
    use crate::fence::store::{Advance, FenceStore};

    /// fencegate 0.1's tables, named here as it named them, not through the
    /// constants the current code uses: both map a `&str` to a `u64`.
    fn old_table(name: &str) -> redb2::TableDefinition<'_, &'static str, u64> {
        redb2::TableDefinition::new(name)
    }

    /// Writes a store as fencegate 0.1 did, with redb 2 in its file format
    /// v2: the marks in "fences", and "clean" in "meta" (1 after a clean stop,
    /// 0 while a process had the store open).
    fn write_v2(dir: &Path, marks: &[(String, u64)], clean: bool) {
        let db = redb2::Database::create(dir.join(DB_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut fences = txn.open_table(old_table("fences")).unwrap();
            for (key, token) in marks {
                fences.insert(key.as_str(), token).unwrap();
            }
            txn.open_table(old_table("meta")).unwrap().insert("clean", u64::from(clean)).unwrap();
        }
        txn.commit().unwrap();
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    async fn close(store: FileStore) {
        let store = Arc::new(store);
        store.close().await;
    }

    #[tokio::test]
    async fn a_store_fencegate_0_1_wrote_opens_with_every_fence_kept() {
        let dir = tempfile::tempdir().unwrap();
        // More marks than one copy transaction takes, and keys of every kind.
        let mut marks: Vec<_> = (0..2 * BATCH as u64 + 3).map(|i| (format!("/objects/{i}"), i * 7 + 1)).collect();
        marks.extend([("/ключ/🔑 ?x=1".to_string(), u64::MAX), ("k".repeat(4096), 2)]);
        marks.sort();
        write_v2(dir.path(), &marks, true);
        let file = dir.path().join(DB_FILE);
        // The old format indeed: the current redb can't open it.
        assert!(matches!(redb::Database::open(&file), Err(redb::DatabaseError::UpgradeRequired(2))));
        let mode =
            |file: &Path| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(file).unwrap().permissions());
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

        let store = FileStore::open(dir.path(), true, 1000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(list_marks(&store.inner.db, "", None, marks.len() + 1).unwrap(), marks);
        assert_eq!(store.tracked_keys(), marks.len());
        assert_eq!(store.get("/objects/5").await.unwrap(), Some(36));
        assert_eq!(store.advance("/objects/5", 35).await.unwrap(), Advance::Stale { current: 36 });
        assert_eq!(store.advance("/objects/5", 40).await.unwrap(), Advance::Accepted { previous: Some(36) });
        close(store).await;
        // The copy took the old file's place, and the next start reads it as it is.
        assert_eq!(files_in(dir.path()), [journal::FILES[0], journal::FILES[1], DB_FILE]);
        assert_eq!(mode(&file) & 0o777, 0o600, "the upgraded file is not as private as the old one");
        let store = FileStore::open(dir.path(), true, 1000).unwrap();
        assert_eq!(store.get("/objects/5").await.unwrap(), Some(40));
        assert_eq!(store.get("/objects/6").await.unwrap(), Some(43));
        close(store).await;
    }

    /// A store file that is a symlink (to a volume mounted elsewhere, say) is
    /// upgraded where it points: the link stays a link, the file it names
    /// holds the fences.
    #[tokio::test]
    async fn a_store_file_behind_a_symlink_is_upgraded_where_it_points() {
        let (dir, volume) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let marks = [("a".to_string(), 5), ("b".to_string(), 7)];
        write_v2(volume.path(), &marks, true);
        let (target, link) = (volume.path().join(DB_FILE), dir.path().join(DB_FILE));
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let store = FileStore::open(dir.path(), true, 100).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.list("", None, 10).await.unwrap(), marks);
        close(store).await;
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
        assert!(redb::Database::open(&target).is_ok(), "the file the link names was not upgraded");
    }

    /// fencegate 0.1 killed with marks only in its journal: the upgrade keeps
    /// the flag that says so, and the journal's marks come back on top.
    #[tokio::test]
    async fn a_crashed_store_fencegate_0_1_wrote_gets_its_journal_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let marks = [("a".to_string(), 5), ("b".to_string(), 7)];
        write_v2(dir.path(), &marks, false);
        let without_journal = tempfile::tempdir().unwrap();
        std::fs::copy(dir.path().join(DB_FILE), without_journal.path().join(DB_FILE)).unwrap();
        std::fs::write(dir.path().join(journal::FILES[0]), journal::tests::file_bytes(1, &[&[("a", 9), ("c", 2)]]).0)
            .unwrap();
        std::fs::write(dir.path().join(journal::FILES[1]), journal::tests::file_bytes(2, &[&[("b", 6)]]).0).unwrap();

        let store = FileStore::open(dir.path(), true, 100).unwrap_or_else(|e| panic!("{e}"));
        let expected = [("a".into(), 9), ("b".into(), 7), ("c".into(), 2)];
        assert_eq!(store.list("", None, 10).await.unwrap(), expected);
        close(store).await;
        // Without its journal, an unclean store still refuses to start after the upgrade.
        let Err(err) = FileStore::open(without_journal.path(), true, 100) else { panic!("opened without its journal") };
        assert!(matches!(err, OpenError::JournalMissing { .. }), "{err}");
    }

    /// Whatever stops the upgrade, the old file stays as it was and the error
    /// names it; a copy left over from an earlier attempt is not the store.
    #[tokio::test]
    async fn an_upgrade_that_cannot_finish_leaves_the_old_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(DB_FILE);
        let marks: Vec<_> = (0..2000u64).map(|i| (format!("/k/{i}"), i)).collect();
        write_v2(dir.path(), &marks, true);
        let whole = std::fs::read(&file).unwrap();
        let refused = |what: &str| {
            let err = FileStore::open(dir.path(), true, 100).err().unwrap_or_else(|| panic!("opened {what}"));
            assert!(err.to_string().contains(&file.display().to_string()), "{what}: {err}");
            assert_eq!(files_in(dir.path()), [DB_FILE], "{what}: files appeared next to the store");
            err
        };

        // Open in another process (here another handle): in use, not upgraded.
        let other = redb2::Database::open(&file).unwrap();
        let open = std::fs::read(&file).unwrap();
        assert!(matches!(refused("while in use"), OpenError::InUse(_)));
        assert_eq!(std::fs::read(&file).unwrap(), open);
        drop(other);
        assert_eq!(std::fs::read(&file).unwrap(), whole);

        // A table fencegate does not know is not dropped on the way.
        {
            let db = redb2::Database::open(&file).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(old_table("other")).unwrap().insert("x", 1).unwrap();
            txn.commit().unwrap();
        }
        let with_other = std::fs::read(&file).unwrap();
        let err = refused("with an unknown table");
        assert!(matches!(err, OpenError::Upgrade { .. }) && err.to_string().contains("\"other\""), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), with_other);

        // Torn: cut short, as by a copy that went wrong.
        std::fs::write(&file, &whole[..whole.len() / 3]).unwrap();
        let err = refused("cut short");
        assert!(matches!(err, OpenError::Upgrade { .. } | OpenError::Corrupt { .. }), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), whole[..whole.len() / 3]);

        // Whole again, beside a copy an interrupted upgrade left: upgraded, nothing lost.
        std::fs::write(&file, &whole).unwrap();
        std::fs::write(copy_path(&file), b"half a copy").unwrap();
        let store = FileStore::open(dir.path(), true, 100).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(list_marks(&store.inner.db, "", None, 3000).unwrap().len(), marks.len());
        close(store).await;
        assert!(!copy_path(&file).exists());
    }
}
