//! Watching the directories of files fencegate reads again when they change
//! (the TLS certificate and key).
//!
//! Directories, not files: Kubernetes updates a mounted Secret or ConfigMap
//! by writing a new hidden directory and swapping the `..data` symlink the
//! visible names point through, so the file's own inode never changes and a
//! watch on it would never fire. An editor that saves by renaming over the
//! file does the same. A change to one of the files' names, or to a name
//! starting with `..` (Kubernetes' `..data` and its timestamped
//! directories), is followed, once the directory has been quiet for
//! [`QUIET`], by one call of the reader, which compares what it reads with
//! what it has. Other files in the directory (a log written beside the
//! config) wake nothing.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode, Watcher};

/// How long a directory must stay quiet after a change before the files are
/// read again: a rotation writes several files, and a reader that looked
/// between them would see a certificate without its key.
pub const QUIET: Duration = Duration::from_millis(250);

/// The longest a burst of changes delays the reader: a directory that is
/// never quiet (a busy working directory) is still read.
pub const MOST_DELAY: Duration = Duration::from_secs(2);

/// Watches until dropped.
pub struct DirWatch {
    _watcher: notify::RecommendedWatcher,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch").finish_non_exhaustive()
    }
}

/// Calls `changed`, on a thread of its own, after each burst of changes in the
/// directories that hold `files`, once they have been quiet for [`QUIET`]
/// (or the burst has gone on for [`MOST_DELAY`]).
pub fn watch_dirs_of<'a>(
    files: impl IntoIterator<Item = &'a Path>,
    mut changed: impl FnMut() + Send + 'static,
) -> notify::Result<DirWatch> {
    let (tx, rx) = mpsc::channel::<()>();
    let files: Vec<&Path> = files.into_iter().collect();
    let names: BTreeSet<OsString> = files.iter().filter_map(|f| f.file_name()).map(OsString::from).collect();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if concerns(&event, &names) {
            let _ = tx.send(());
        }
    })?;
    let dirs: BTreeSet<PathBuf> = files.into_iter().map(dir_of).collect();
    for dir in &dirs {
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
    }
    std::thread::Builder::new()
        .name("fencegate-watch".into())
        .spawn(move || {
            // Ends when the watcher (and with it the sender) is dropped.
            while rx.recv().is_ok() {
                let latest = Instant::now() + MOST_DELAY;
                loop {
                    let wait = QUIET.min(latest.saturating_duration_since(Instant::now()));
                    match rx.recv_timeout(wait) {
                        Ok(()) if Instant::now() < latest => continue,
                        Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => break,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                changed();
            }
        })
        .map_err(notify::Error::io)?;
    Ok(DirWatch { _watcher: watcher })
}

/// Whether `event` may change one of the files named `names`: a change to
/// one of those names, or to a name starting with `..` (what a Kubernetes
/// volume swaps). Reads (ours among them) change nothing; an error, or an
/// event that names no path, may have lost a change, so it counts as one.
fn concerns(event: &notify::Result<notify::Event>, names: &BTreeSet<OsString>) -> bool {
    match event {
        Err(_) => true,
        Ok(notify::Event { kind: EventKind::Access(_), .. }) => false,
        Ok(event) if event.paths.is_empty() => true,
        Ok(event) => event
            .paths
            .iter()
            .filter_map(|path| path.file_name())
            .any(|name| names.contains(name) || name.as_encoded_bytes().starts_with(b"..")),
    }
}

/// The directory `file` is listed in (`.` for a bare name).
fn dir_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn wait_for(calls: &AtomicUsize, n: usize) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if calls.load(Ordering::SeqCst) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn a_symlink_swapped_in_the_directory_is_one_change_and_reads_are_none() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir(dir.join("..v1")).unwrap();
        std::fs::write(dir.join("..v1/tls.crt"), "one").unwrap();
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let file = dir.join("tls.crt");
        let read = file.clone();
        let _watch = watch_dirs_of([file.as_path()], move || {
            let _ = std::fs::read(&read);
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();

        // The Kubernetes way: a new directory, a new link, renamed over ..data.
        std::fs::create_dir(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v2/tls.crt"), "two").unwrap();
        std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        std::fs::remove_dir_all(dir.join("..v1")).unwrap();
        assert!(wait_for(&calls, 1), "the swap was not seen");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "two");
        // The reader's own reads are no change: once the burst is over (the
        // steps above may have been seen as one burst or, on a busy machine,
        // as several), nothing calls the reader again.
        std::thread::sleep(QUIET * 4);
        let settled = calls.load(Ordering::SeqCst);
        std::thread::sleep(QUIET * 4);
        assert_eq!(calls.load(Ordering::SeqCst), settled, "reading is no change");
    }

    #[test]
    fn other_files_in_the_directory_wake_nothing_and_the_file_does() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let file = dir.join("fencegate.toml");
        std::fs::write(&file, "one").unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let _watch = watch_dirs_of([file.as_path()], move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        // A log written beside the config, again and again.
        for i in 0..20 {
            std::fs::write(dir.join("fencegate.log"), format!("line {i}\n")).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(QUIET * 3);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "a write to another file woke the reader");
        // An editor saving by renaming over the file is seen.
        std::fs::write(dir.join(".fencegate.toml.tmp"), "two").unwrap();
        std::fs::rename(dir.join(".fencegate.toml.tmp"), &file).unwrap();
        assert!(wait_for(&calls, 1), "the rename over the file was not seen");
    }
}
