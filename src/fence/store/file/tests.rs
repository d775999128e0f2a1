//! Tests of the whole file store: opened on a temporary directory, driven
//! through [`FenceStore`], closed and reopened.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;

use super::cache::{list_marks, sweep};
use super::journal::{self, Marks};
use super::{lock, FileStore, OpenError, Tuning, DB_FILE};
use crate::fence::store::{Advance, FenceStore, StoreError, MAX_LIST_LIMIT};

fn temp_dir() -> TempDir {
    tempfile::tempdir().unwrap()
}

/// Closes `store` and lets go of it: its threads have ended and the database
/// file is no longer locked.
async fn close(store: impl Into<Arc<FileStore>>) {
    let store = store.into();
    store.close().await;
    drop(store);
}

fn in_tree(store: &FileStore) -> Vec<(String, u64)> {
    list_marks(&store.inner.db, "", None, MAX_LIST_LIMIT).unwrap()
}

#[tokio::test]
async fn marks_survive_reopening_and_equal_tokens_touch_no_disk() {
    let dir = temp_dir();
    let store = FileStore::open(dir.path(), false, 100).unwrap();
    assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Accepted { previous: None });
    assert_eq!(store.advance("k", 7).await.unwrap(), Advance::Accepted { previous: Some(5) });
    let commits = store.stats().unwrap().commits();
    assert_eq!(commits, 2);
    for _ in 0..10 {
        assert_eq!(store.advance("k", 7).await.unwrap(), Advance::Accepted { previous: Some(7) });
    }
    assert_eq!(store.stats().unwrap().commits(), commits, "an equal token committed");
    assert_eq!(store.advance("k", 6).await.unwrap(), Advance::Stale { current: 7 });
    close(store).await;

    let store = FileStore::open(dir.path(), true, 100).unwrap();
    assert_eq!(store.get("k").await.unwrap(), Some(7));
    assert_eq!(store.advance("k", 6).await.unwrap(), Advance::Stale { current: 7 });
    assert_eq!(store.tracked_keys(), 1);
    close(store).await;
}

#[tokio::test]
async fn a_closed_store_refuses_raises_and_still_answers_reads() {
    let dir = temp_dir();
    let store = FileStore::open(dir.path(), false, 100).unwrap();
    assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Accepted { previous: None });
    store.close().await;
    assert!(matches!(store.advance("k", 6).await, Err(StoreError::Closing)));
    // Refused, yet enforced from then on, as after any failed commit: fail closed.
    assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Stale { current: 6 });
    assert_eq!(store.get("j").await.unwrap(), None);
    // Closing twice is harmless, and the store file is complete without the journal.
    store.close().await;
    assert_eq!(in_tree(&store), [("k".into(), 5)]);
}

/// Polls `fut` once, then drops it: a caller that goes away.
pub(super) async fn poll_once_and_drop<F: std::future::Future>(fut: F) {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let _ = fut.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await;
}

pub(super) async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "waited 20 s for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn a_raise_whose_caller_went_away_is_still_counted_and_made_durable() {
    let dir = temp_dir();
    // Every append fills a journal file; a second full file waits for the fold.
    let tuning =
        Tuning { fold_bytes: 1, max_journal_bytes: 1, fold_wait: Duration::from_secs(60), ..Tuning::default() };
    let store = FileStore::open_tuned(dir.path(), false, 100, tuning).unwrap();
    let blocker = store.inner.db.begin_write().unwrap();
    assert_eq!(store.advance("a", 3).await.unwrap(), Advance::Accepted { previous: None });
    assert_eq!(store.advance("b", 1).await.unwrap(), Advance::Accepted { previous: None });
    // Cached (no mark), so the raise is queued at its first poll: behind the
    // stuck fold. Then its caller goes away.
    assert_eq!(store.get("k").await.unwrap(), None);
    poll_once_and_drop(store.advance("k", 9)).await;
    assert_eq!(store.inner.cache.get("k").map(|e| (e.mark, e.raising)), Some((Some(9), 1)));
    drop(blocker);
    wait_until("the raise to be settled", || {
        store.inner.cache.get("k").is_some_and(|e| e.durable == Some(9) && e.raising == 0)
    })
    .await;
    assert_eq!(store.tracked_keys(), 3);
    close(store).await;
}

#[tokio::test]
async fn raises_that_fail_stay_enforced_but_do_not_fill_the_cache() {
    let dir = temp_dir();
    let store = FileStore::open(dir.path(), false, 10).unwrap();
    assert_eq!(store.advance("/kept", 3).await.unwrap(), Advance::Accepted { previous: None });
    // A closed store fails every raise, as a failing disk does.
    store.close().await;
    for i in 0..100 {
        assert!(matches!(store.advance(&format!("/{i}"), 7).await, Err(StoreError::Closing)), "{i}");
    }
    assert!(matches!(store.advance("/kept", 9).await, Err(StoreError::Closing)));
    // Enforced while they are cached: fail closed.
    assert_eq!(store.advance("/99", 6).await.unwrap(), Advance::Stale { current: 7 });
    // Nothing was forwarded on them: when the room is needed, they go, and
    // the disk's marks are enforced again.
    sweep(&store.inner);
    sweep(&store.inner);
    assert!(store.cached_keys() <= 10, "{} marks cached, capacity 10", store.cached_keys());
    assert_eq!(store.get("/kept").await.unwrap(), Some(3));
    assert_eq!(store.get("/0").await.unwrap(), None);
    assert_eq!(store.tracked_keys(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_raises_share_commits() {
    let dir = temp_dir();
    let store = Arc::new(FileStore::open(dir.path(), false, 10_000).unwrap());
    let tasks: Vec<_> = (0..256)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.advance(&format!("key-{i}"), 1).await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Advance::Accepted { previous: None });
    }
    let stats = store.stats().unwrap();
    assert_eq!(stats.raises(), 256);
    assert!(stats.commits() < stats.raises(), "{} commits for {} raises", stats.commits(), stats.raises());
    assert_eq!(store.tracked_keys(), 256);
    close(store).await;
}

#[test]
fn waiters_on_several_single_threaded_runtimes_are_all_answered() {
    let dir = temp_dir();
    // Opened outside any runtime; the waiters run on runtimes of their own.
    let store = Arc::new(FileStore::open(dir.path(), false, 10_000).unwrap());
    let workers: Vec<_> = (0..3)
        .map(|worker| {
            let store = store.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    for round in 1..=20u64 {
                        let raises: Vec<_> = (0..16)
                            .map(|i| {
                                let store = store.clone();
                                tokio::spawn(async move { store.advance(&format!("w{worker}-k{i}"), round).await })
                            })
                            .collect();
                        for raise in raises {
                            let answered = tokio::time::timeout(Duration::from_secs(30), raise).await;
                            let advance = answered.expect("a waiter was never woken").unwrap().unwrap();
                            assert!(matches!(advance, Advance::Accepted { .. }), "{advance:?}");
                        }
                    }
                })
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let stats = store.stats().unwrap();
    assert_eq!(stats.raises(), 3 * 16 * 20);
    assert!(stats.commits() < stats.raises(), "{} commits", stats.commits());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(close(store));
}

#[tokio::test]
async fn evicted_marks_come_back_from_disk() {
    let dir = temp_dir();
    let store = FileStore::open(dir.path(), false, 100).unwrap();
    for i in 0..1000u64 {
        store.advance(&format!("k{i}"), i).await.unwrap();
    }
    sweep(&store.inner);
    sweep(&store.inner);
    assert!(store.cached_keys() <= 100, "{} cached", store.cached_keys());
    for i in (0..1000u64).step_by(37) {
        assert_eq!(store.get(&format!("k{i}")).await.unwrap(), Some(i));
        if i > 0 {
            assert_eq!(store.advance(&format!("k{i}"), i - 1).await.unwrap(), Advance::Stale { current: i });
        }
    }
    let page = store.list("k1", None, 5).await.unwrap();
    assert_eq!(
        page,
        [("k1".into(), 1), ("k10".into(), 10), ("k100".into(), 100), ("k101".into(), 101), ("k102".into(), 102)]
    );
    let next = store.list("k1", Some("k102"), 2).await.unwrap();
    assert_eq!(next, [("k103".into(), 103), ("k104".into(), 104)]);
    close(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_is_folded_into_the_tree_and_emptied() {
    let dir = temp_dir();
    // Every append fills a journal file.
    let tuning = Tuning { fold_bytes: 1, ..Tuning::default() };
    let store = FileStore::open_tuned(dir.path(), false, 100, tuning).unwrap();
    for token in 1..=20 {
        store.advance("k", token).await.unwrap();
        store.advance(&format!("k{token}"), token).await.unwrap();
    }
    let stats = store.stats().unwrap();
    // Folds run in the background: wait for them to catch up (bounded, not timed).
    for _ in 0..500 {
        if in_tree(&store).len() == 21 && lock(&store.inner.unfolded).folding.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tree = in_tree(&store);
    assert_eq!(tree.len(), 21, "{tree:?}");
    assert!(tree.contains(&("k".into(), 20)), "{tree:?}");
    assert!(stats.folds.get() >= 2, "{} folds", stats.folds.get());
    assert_eq!(store.tracked_keys(), 21);
    // Closing folds what is left and empties both journal files.
    close(store).await;
    let journaled: u64 = journal::FILES
        .into_iter()
        .map(|name| journal::replay(&std::fs::read(dir.path().join(name)).unwrap(), &mut Marks::default()))
        .map(|replayed| replayed.unwrap().records)
        .sum();
    assert_eq!(journaled, 0);
    let store = FileStore::open(dir.path(), true, 100).unwrap();
    assert_eq!(store.get("k").await.unwrap(), Some(20));
    assert_eq!(store.tracked_keys(), 21);
    close(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaled_marks_may_leave_the_cache_but_marks_not_yet_durable_never_do() {
    let dir = temp_dir();
    // Capacity 1: a sweep evicts everything it may. Every append fills a
    // journal file, and a second full file waits for the fold of the first.
    let tuning =
        Tuning { fold_bytes: 1, max_journal_bytes: 1, fold_wait: Duration::from_secs(60), ..Tuning::default() };
    let store = Arc::new(FileStore::open_tuned(dir.path(), false, 1, tuning).unwrap());
    // Hold redb's single write transaction: no fold can finish.
    let blocker = store.inner.db.begin_write().unwrap();
    assert_eq!(store.advance("a", 3).await.unwrap(), Advance::Accepted { previous: None });
    assert_eq!(store.advance("b", 1).await.unwrap(), Advance::Accepted { previous: None });
    // Both are durable in the journal and not in the tree: they may leave the
    // cache, and a miss finds them in the journal's marks.
    sweep(&store.inner);
    sweep(&store.inner);
    assert_eq!(store.cached_keys(), 0);
    assert_eq!(store.advance("a", 2).await.unwrap(), Advance::Stale { current: 3 });
    assert_eq!(store.list("", None, 10).await.unwrap(), [("a".into(), 3), ("b".into(), 1)]);
    // The next append waits for the fold: its mark is not durable and must stay.
    let raising = tokio::spawn({
        let store = store.clone();
        async move { store.advance("k", 9).await }
    });
    while store.inner.cache.get("k").and_then(|e| e.mark) != Some(9) {
        tokio::task::yield_now().await;
    }
    sweep(&store.inner);
    sweep(&store.inner);
    assert!(store.inner.cache.contains_key("k"), "a mark not yet on disk left the cache");
    assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Stale { current: 9 });
    assert!(!raising.is_finished());
    drop(blocker);
    assert_eq!(raising.await.unwrap().unwrap(), Advance::Accepted { previous: None });
    assert_eq!(store.list("", None, 10).await.unwrap(), [("a".into(), 3), ("b".into(), 1), ("k".into(), 9)]);
    close(store).await;
}

#[tokio::test]
async fn a_torn_journal_tail_is_dropped_and_a_damaged_journal_refuses_to_open() {
    let dir = temp_dir();
    close(FileStore::open(dir.path(), false, 10).unwrap()).await;
    let journal_file = dir.path().join(journal::FILES[1]);
    let (mut bytes, ends) = journal::tests::file_bytes(42, &[&[("a", 5)], &[("b", 6)]]);
    std::fs::write(&journal_file, &bytes[..ends[1] - 3]).unwrap();
    let store = FileStore::open(dir.path(), true, 10).unwrap();
    assert_eq!(store.get("a").await.unwrap(), Some(5));
    assert_eq!(store.get("b").await.unwrap(), None, "a torn frame was replayed");
    close(store).await;
    // Emptied: what it held is folded, and a restart finds no frames in it.
    let mut left = Marks::default();
    assert_eq!(journal::replay(&std::fs::read(&journal_file).unwrap(), &mut left).unwrap().records, 0);
    // The first frame damaged, the second whole: refuse, and change nothing.
    bytes[ends[0] - 1] ^= 0xFF;
    std::fs::write(&journal_file, &bytes).unwrap();
    let err = FileStore::open(dir.path(), true, 10).unwrap_err();
    let damaged = journal::ReplayError::Damaged {
        at: journal::HEADER_BYTES,
        why: journal::FrameDamage::PayloadChecksum,
        next: ends[0] as u64,
    };
    assert!(matches!(&err, OpenError::Replay { source, .. } if *source == damaged), "{err}");
    assert!(err.to_string().contains(journal::FILES[1]), "{err}");
    assert!(err.to_string().contains("corrupt"), "{err}");
    assert_eq!(std::fs::read(&journal_file).unwrap(), bytes);
}

#[tokio::test]
async fn a_start_that_fails_before_journaling_does_not_make_the_journal_required() {
    let dir = temp_dir();
    close(FileStore::open(dir.path(), false, 10).unwrap()).await;
    // The second journal file can't be opened (a directory stands in its place).
    let second = dir.path().join(journal::FILES[1]);
    std::fs::remove_file(&second).unwrap();
    std::fs::create_dir(&second).unwrap();
    let err = FileStore::open(dir.path(), true, 10).expect_err("opened with a directory for a journal file");
    assert!(matches!(err, OpenError::Journal { .. }), "{err}");
    // Nothing was journaled, so the store file still holds every mark: with
    // the directory gone, the store opens (and makes a new journal file).
    std::fs::remove_dir(&second).unwrap();
    close(FileStore::open(dir.path(), true, 10).unwrap_or_else(|e| panic!("{e}"))).await;
}

#[test]
fn a_corrupt_file_refuses_to_open_and_a_missing_one_can_be_required() {
    let parent = temp_dir();
    let dir = parent.path().join("store");
    assert!(matches!(FileStore::open(&dir, true, 10), Err(OpenError::Missing(_))));
    std::fs::create_dir_all(&dir).unwrap();
    // An empty file is no store either.
    std::fs::write(dir.join(DB_FILE), b"").unwrap();
    assert!(matches!(FileStore::open(&dir, true, 10), Err(OpenError::Missing(_))));
    std::fs::write(dir.join(DB_FILE), vec![0xA5u8; 64 * 1024]).unwrap();
    let err = FileStore::open(&dir, false, 10).unwrap_err();
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("refusing to start"), "{err}");
    // Nothing was written over the corrupt file.
    assert_eq!(std::fs::read(dir.join(DB_FILE)).unwrap(), vec![0xA5u8; 64 * 1024]);
}

/// A fold that cannot finish (another write transaction holds the B-tree):
/// the first append that needs the full journal waits for the fold and fails
/// when the wait runs out, later ones fail without waiting, the refused mark
/// is still enforced, and everything recovers once the fold ends. Waits are
/// counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_fold_fails_appends_closed_then_recovers() {
    let dir = temp_dir();
    let tuning =
        Tuning { fold_bytes: 1, max_journal_bytes: 1, fold_wait: Duration::from_millis(100), ..Tuning::default() };
    let store = Arc::new(FileStore::open_tuned(dir.path(), false, 100, tuning).unwrap());
    let fold_waits = || store.queue.fold_waits.load(Ordering::SeqCst);
    let blocker = store.inner.db.begin_write().unwrap();
    // The first fills one file and hands it to the fold, the second the other.
    assert_eq!(store.advance("a", 3).await.unwrap(), Advance::Accepted { previous: None });
    assert_eq!(store.advance("b", 1).await.unwrap(), Advance::Accepted { previous: None });
    assert_eq!(fold_waits(), 0);
    let err = store.advance("k", 9).await.expect_err("the journal is full and the fold stuck: 503");
    assert!(matches!(err, StoreError::FoldStuck), "{err}");
    assert_eq!(fold_waits(), 1, "the append did not wait for the fold");
    let err = store.advance("j", 1).await.expect_err("the fold is still stuck");
    assert!(matches!(err, StoreError::FoldStuck), "{err}");
    assert_eq!(fold_waits(), 1, "a later append waited again");
    assert!(store.stats().unwrap().is_failing());
    assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Stale { current: 9 });
    drop(blocker);
    // The commit thread learns that the fold ended at its next append.
    let mut tries = 0;
    while store.advance("k", 9).await.is_err() {
        tries += 1;
        assert!(tries < 500, "the journal never drained after the fold was let go");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!store.stats().unwrap().is_failing());
    close(store).await;
    let store = FileStore::open(dir.path(), true, 100).unwrap();
    assert_eq!((store.get("a").await.unwrap(), store.get("k").await.unwrap()), (Some(3), Some(9)));
    close(store).await;
}

/// What a crash leaves while one journal file is being folded and the other
/// takes appends: every acknowledged mark comes back from the two files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_with_one_journal_file_folding_and_the_other_in_use_loses_nothing() {
    let (dir, crashed) = (temp_dir(), temp_dir());
    let tuning = Tuning { fold_bytes: 1, ..Tuning::default() };
    let store = FileStore::open_tuned(dir.path(), false, 100, tuning).unwrap();
    let blocker = store.inner.db.begin_write().unwrap();
    store.advance("a", 3).await.unwrap();
    store.advance("b", 4).await.unwrap();
    store.advance("a", 5).await.unwrap();
    // The files as they are on disk now: both journal files hold frames.
    for name in [DB_FILE, journal::FILES[0], journal::FILES[1]] {
        std::fs::copy(dir.path().join(name), crashed.path().join(name)).unwrap();
        if name != DB_FILE {
            let bytes = std::fs::read(dir.path().join(name)).unwrap();
            let replayed = journal::replay(&bytes, &mut Marks::new()).unwrap();
            assert!(replayed.records > 0, "{name} holds no frame");
        }
    }
    drop(blocker);
    close(store).await;
    let store = FileStore::open(crashed.path(), true, 100).unwrap();
    assert_eq!((store.get("a").await.unwrap(), store.get("b").await.unwrap()), (Some(5), Some(4)));
    close(store).await;
}
