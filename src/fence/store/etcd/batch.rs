//! Group commit of turns: the transactions of the turns that come while
//! others are on their way to etcd go together, each a nested transaction
//! of one outer transaction. etcd evaluates each nested transaction's
//! comparisons on its own, so every turn is decided on its own key, but
//! the gRPC call, the Raft entry, the disk write and the apply are paid once
//! per batch. The turns of a batch share its fate otherwise: a batch that
//! fails (etcd did not answer in time) fails each, and the comparison a
//! batch makes for its guessed turns (no hold, the deletions count) sends
//! them to decide again when it fails.
//!
//! etcd refuses a transaction that puts one key twice (even in two nested
//! transactions), so a batch holds at most one turn of each fence key; a
//! turn of a key already in the batch goes in the next.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Weak};

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::client::c_txn;
use super::{unexpected, Inner};
use crate::fence::store::{Found, StoreError};

/// Turns per batch: etcd refuses more than `--max-txn-ops` (128 by
/// default) operations on one level of a transaction.
const MOST: usize = 64;

/// Bytes of keys and values per batch, well under etcd's request limit
/// (`--max-request-bytes`, 1.5 MiB by default).
const MOST_BYTES: usize = 256 * 1024;

/// Batches on their way to etcd at once. The next batch is gathered once a
/// permit is free, so the turns that arrive meanwhile wait in the channel
/// and go together (one: etcd orders them anyway, and one at a time makes
/// the batches larger; two measured slower, `benches/README.md`).
const IN_FLIGHT: usize = 1;

/// A transaction's answer: whether its comparisons held, what its operations
/// answered, and the revision of the outer transaction.
pub(super) type Answer = Result<(bool, Vec<TxnOpResponse>, i64), StoreError>;

/// One turn's transaction, waiting for a batch.
pub(super) struct Item {
    key: String,
    txn: Txn,
    bytes: usize,
    /// The deletions counter the turn was decided on, if the batch is to
    /// compare it: a batch compares it (and that no hold is put) once for
    /// every turn in it, which answer nothing if it moved.
    deletions: Option<u64>,
    /// The record the turn writes, if it does: deleted here when the
    /// turn's request went while its batch was on its way (its own delete
    /// may have come before the batch's write).
    record: Option<String>,
    answer: oneshot::Sender<Answer>,
}

impl Inner {
    /// `txn`, for a turn of `key` (whose etcd keys add up to about `bytes`),
    /// committed in the next batch; one that compares that no hold is put
    /// and that the deletions counter is still `deletions`, if given. If
    /// that comparison fails, the turn's does too, with no answer.
    pub(super) async fn batched(
        &self,
        context: &'static str,
        key: &str,
        bytes: usize,
        deletions: Option<u64>,
        record: Option<&str>,
        txn: Txn,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let record = record.map(str::to_owned);
        let item = Item { key: key.to_owned(), txn, bytes, deletions, record, answer };
        if self.batches.send(item).is_err() {
            return Err(self.no_answer(context));
        }
        answered.await.unwrap_or_else(|_| Err(self.no_answer(context)))
    }

    /// Sends `batch` as one transaction and answers each turn in it. When
    /// the batch's own comparison fails (a hold put, marks deleted), the
    /// guessed turns answer nothing and decide again; the others go all
    /// the same, in the transaction's other branch.
    async fn commit_batch(&self, batch: Vec<Item>) {
        // Fail closed: a store distrusted since these turns began takes none.
        if let Err(e) = self.not_distrusted() {
            batch.into_iter().for_each(|item| drop(item.answer.send(Err(e.clone()))));
            return;
        }
        let deletions = batch.iter().find_map(|item| item.deletions);
        let mut unguessed = Vec::new();
        let mut turns = Vec::with_capacity(batch.len());
        let mut answers = Vec::with_capacity(batch.len());
        for item in batch {
            if item.deletions.is_none() && deletions.is_some() {
                unguessed.push(TxnOp::txn(item.txn.clone()));
            }
            answers.push((item.answer, item.deletions.is_none(), item.record));
            turns.push(TxnOp::txn(item.txn));
        }
        // (etcd-client wants the comparisons, then the success branch, then the failure one.)
        let txn = match deletions {
            Some(deletions) => Txn::new()
                .when([
                    Compare::version(self.names.held(), CompareOp::Equal, 0),
                    Compare::version(self.names.deletions(), CompareOp::Equal, deletions as i64),
                ])
                .and_then(turns)
                .or_else(unguessed),
            None => Txn::new().and_then(turns),
        };
        let floor = self.revision_floor();
        let answer = self.call("deciding keys' turns", |mut c| c_txn(&mut c, &txn)).await;
        let answer = answer.and_then(|mut a| {
            let revision = self.observe_header(a.take_header(), floor)?;
            // Distrusted while the batch was out: nothing it let on is
            // forwarded (each turn's record is ended as for any error).
            self.not_distrusted()?;
            Ok((revision, a.op_responses(), a.succeeded()))
        });
        match answer {
            Ok((revision, responses, succeeded)) => {
                let mut responses = responses.into_iter();
                for (to, unguessed, record) in answers {
                    let answer = match (succeeded || unguessed).then(|| responses.next()) {
                        None => Ok((false, Vec::new(), revision)),
                        Some(Some(TxnOpResponse::Txn(nested))) => {
                            Ok((nested.succeeded(), nested.op_responses(), revision))
                        }
                        Some(_) => Err(unexpected(Found::Verdict("a batch answered without one of its turns".into()))),
                    };
                    let wrote = matches!(answer, Ok((true, _, _)));
                    if let (Err(_), Some(record), true) = (to.send(answer), record, wrote) {
                        self.end_record(record);
                    }
                }
            }
            Err(e) => answers.into_iter().for_each(|(to, _, _)| drop(to.send(Err(e.clone())))),
        }
    }
}

/// One batch: `first`, then the turns put off from the last batch, in order,
/// then the ones that come from `more`, as long as they fit; the ones that
/// do not (a second turn of one key, another deletions count, or the batch
/// is full) are put off.
fn gather(first: Item, later: &mut VecDeque<Item>, mut more: impl FnMut() -> Option<Item>) -> Vec<Item> {
    let mut keys = HashSet::from([first.key.clone()]);
    let mut bytes = first.bytes;
    let mut deletions = first.deletions;
    let mut batch = vec![first];
    let mut fits = |item: &Item, batch: &Vec<Item>| {
        let fits = batch.len() < MOST
            && bytes + item.bytes <= MOST_BYTES
            && !keys.contains(&item.key)
            && (item.deletions.is_none() || deletions.is_none() || item.deletions == deletions);
        if fits {
            keys.insert(item.key.clone());
            bytes += item.bytes;
            deletions = deletions.or(item.deletions);
        }
        fits
    };
    let mut kept = VecDeque::new();
    while let Some(item) = later.pop_front() {
        if fits(&item, &batch) {
            batch.push(item);
        } else {
            kept.push_back(item);
        }
    }
    *later = kept;
    while batch.len() < MOST {
        let Some(item) = more() else { break };
        if fits(&item, &batch) {
            batch.push(item);
        } else {
            later.push_back(item);
        }
    }
    batch
}

/// Gathers turns into batches and sends them, [`IN_FLIGHT`] at most at once,
/// while the store lives.
pub(super) async fn send_batches(inner: Weak<Inner>, mut items: mpsc::UnboundedReceiver<Item>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut later: VecDeque<Item> = VecDeque::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let first = match later.pop_front() {
            Some(item) => item,
            None => match items.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let mut batch = gather(first, &mut later, || items.try_recv().ok());
        // A turn whose request is gone by now is not sent: its record would
        // be deleted before the transaction could write it. (One gone while
        // the batch is on its way has its record deleted once the batch
        // is answered.)
        batch.retain(|item| !item.answer.is_closed());
        let Some(store) = inner.upgrade() else { return };
        tokio::spawn(async move {
            if !batch.is_empty() {
                store.commit_batch(batch).await;
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str, bytes: usize) -> Item {
        Item { key: key.into(), txn: Txn::new(), bytes, deletions: None, record: None, answer: oneshot::channel().0 }
    }

    fn keys(batch: &[Item]) -> Vec<&str> {
        batch.iter().map(|i| i.key.as_str()).collect()
    }

    #[test]
    fn a_batch_holds_one_turn_of_each_key_and_puts_the_others_off_in_order() {
        let mut later = VecDeque::new();
        let mut coming = vec![item("b", 1), item("a", 1), item("c", 1), item("a", 1)].into_iter();
        let batch = gather(item("a", 1), &mut later, || coming.next());
        assert_eq!(keys(&batch), ["a", "b", "c"]);
        assert_eq!(later.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["a", "a"]);
        // The next batch takes one of the put-off turns of `a`, first come first.
        let batch = gather(item("d", 1), &mut later, || None);
        assert_eq!(keys(&batch), ["d", "a"]);
        assert_eq!(later.len(), 1);
    }

    #[test]
    fn a_batch_compares_one_deletions_count() {
        let counted = |key: &str, deletions: Option<u64>| Item { deletions, ..item(key, 1) };
        let mut later = VecDeque::new();
        let mut coming = vec![counted("b", None), counted("c", Some(4)), counted("d", Some(3))].into_iter();
        let batch = gather(counted("a", Some(3)), &mut later, || coming.next());
        assert_eq!(keys(&batch), ["a", "b", "d"]);
        assert_eq!(keys(later.make_contiguous()), ["c"]);
    }

    #[test]
    fn a_batch_stays_within_its_turns_and_bytes() {
        let mut later = VecDeque::new();
        let mut n = 0;
        let batch = gather(item("k", 1), &mut later, || {
            n += 1;
            (n <= 2 * MOST).then(|| item(&format!("k{n}"), 1))
        });
        assert_eq!(batch.len(), MOST);
        assert!(later.is_empty());
        assert_eq!(n, MOST - 1, "no turn is taken once the batch is full");
        let mut later = VecDeque::new();
        let mut big = vec![item("x", MOST_BYTES / 2), item("y", MOST_BYTES / 2)].into_iter();
        let batch = gather(item("w", MOST_BYTES / 2), &mut later, || big.next());
        assert_eq!(keys(&batch), ["w", "x"]);
        assert_eq!(keys(later.make_contiguous()), ["y"]);
    }
}
