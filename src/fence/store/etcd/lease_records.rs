//! The lease records of fence/lease.rs in etcd: `P lease/<key>`, the
//! record's JSON, changed only by a transaction that compares it whole.
//!
//! A record has no etcd lease of its own: it stays until its holder
//! releases it or the next holder takes it over, so a late holder is told
//! its lease ran out rather than that it never had one.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::{unexpected, Inner};
use crate::fence::store::{Found, LeaseRecord, StoreError};

impl Inner {
    /// The lease record of `key`, if it has one.
    pub(super) async fn lease_record(&self, key: &str) -> Result<Option<LeaseRecord>, StoreError> {
        self.trusted().await?;
        let name = self.names.lease(key);
        let (_, responses, _) =
            self.txn("reading a lease", Txn::new().and_then([TxnOp::get(name.as_str(), None)])).await?;
        match responses.into_iter().next() {
            Some(TxnOpResponse::Get(mut get)) => match get.take_kvs().pop() {
                None => Ok(None),
                Some(kv) => LeaseRecord::decode(super::STORE, kv.value()).map(Some),
            },
            _ => Err(unexpected(Found::Verdict("an answer to a read that is not a read".into()))),
        }
    }

    /// Puts `new` in place of `key`'s record (`None`: deletes it) if the
    /// record is `expected` now, byte for byte as written.
    pub(super) async fn swap_lease_record(
        &self,
        key: &str,
        expected: Option<&LeaseRecord>,
        new: Option<&LeaseRecord>,
    ) -> Result<bool, StoreError> {
        self.trusted().await?;
        let name = self.names.lease(key);
        let compare = match expected {
            None => Compare::version(name.as_str(), CompareOp::Equal, 0),
            Some(record) => Compare::value(name.as_str(), CompareOp::Equal, record.encode()),
        };
        let change = match new {
            None => TxnOp::delete(name.as_str(), None),
            Some(record) => TxnOp::put(name.as_str(), record.encode(), None),
        };
        let (swapped, _, _) = self.txn("changing a lease", Txn::new().when([compare]).and_then([change])).await?;
        Ok(swapped)
    }
}
