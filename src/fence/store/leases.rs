//! Lease records: who holds a key's lease, with which token, until when.
//!
//! A store keeps one record per key with a lease, beside the key's mark, and
//! changes it only by a compare-and-swap of the whole record
//! ([`FenceStore::swap_lease`](super::FenceStore::swap_lease)). Everything
//! else a lease is (the token above every one issued or seen, the takeover of
//! an expired lease) is built on that and on the mark's own
//! compare-and-raise, once for every store, in `fence/lease.rs`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::{Found, StoreError, Unexpected};

/// One key's lease, as a store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    /// The token the holder was issued: the key's mark was raised to it.
    pub token: u64,
    /// Who holds it, as the holder named itself.
    pub holder: String,
    /// When it ends unless renewed, in milliseconds since the Unix epoch, by
    /// the clock of the replica that granted or renewed it.
    pub expires_ms: u64,
}

impl LeaseRecord {
    /// The record as a shared store keeps it: compact JSON, compared whole.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a lease record is plain data")
    }

    /// A record read back from a shared store (`store` names its kind).
    pub fn decode(store: &'static str, bytes: &[u8]) -> Result<LeaseRecord, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            let found = Found::Lease(format!("{e}: {:?}", String::from_utf8_lossy(bytes)));
            StoreError::Unexpected(Unexpected { store, found })
        })
    }
}

/// The lease records of a store of one process (memory, file): in a map of
/// this process. A restart ends every lease; the tokens they were issued
/// stay in the marks, so no token is issued twice where marks survive.
#[derive(Debug, Default)]
pub struct LocalLeases {
    records: Mutex<HashMap<Box<str>, LeaseRecord>>,
}

impl LocalLeases {
    /// The record of `key`, if it has one.
    pub fn get(&self, key: &str) -> Option<LeaseRecord> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner).get(key).cloned()
    }

    /// Puts `new` in place of `key`'s record (`None`: removes it) when the
    /// record is `expected` now; says whether it did.
    pub fn swap(&self, key: &str, expected: Option<&LeaseRecord>, new: Option<&LeaseRecord>) -> bool {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if records.get(key) != expected {
            return false;
        }
        match new {
            Some(new) => records.insert(key.into(), new.clone()),
            None => records.remove(key),
        };
        true
    }

    /// How many keys have a record.
    pub fn len(&self) -> usize {
        self.records.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no key has a record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(token: u64, holder: &str) -> LeaseRecord {
        LeaseRecord { token, holder: holder.into(), expires_ms: 1_000 }
    }

    #[test]
    fn a_swap_takes_only_from_the_record_expected() {
        let leases = LocalLeases::default();
        assert!(!leases.swap("k", Some(&record(1, "a")), Some(&record(2, "b"))), "no record yet");
        assert!(leases.swap("k", None, Some(&record(1, "a"))));
        assert!(!leases.swap("k", None, Some(&record(2, "b"))), "a record is there now");
        assert!(!leases.swap("k", Some(&record(1, "b")), None), "same token, another holder");
        assert_eq!(leases.get("k"), Some(record(1, "a")));
        assert!(leases.swap("k", Some(&record(1, "a")), None));
        assert_eq!(leases.get("k"), None);
        assert!(leases.is_empty());
    }

    /// The swap compares a record read back, encoded again, with the bytes
    /// the store holds: they must be the bytes written, whatever the holder.
    #[test]
    fn a_record_read_back_encodes_to_the_bytes_written() {
        for holder in ["w1", "wörker \u{1F512}", "tab\there \"quoted\" back\\slash", "\u{7f}\u{2028}"] {
            let written =
                LeaseRecord { token: u64::MAX - 1, holder: holder.into(), expires_ms: 1_700_000_000_123 }.encode();
            let read = LeaseRecord::decode("etcd", written.as_bytes()).unwrap();
            assert_eq!(read.encode(), written, "{holder:?}");
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_anything_else_is_refused() {
        let r = LeaseRecord { token: u64::MAX, holder: "w \"1\"".into(), expires_ms: 7 };
        assert_eq!(LeaseRecord::decode("Redis", r.encode().as_bytes()).unwrap(), r);
        for bad in [&b"{}"[..], b"7", b"{\"token\":1,\"holder\":\"a\",\"expires_ms\":1,\"x\":1}"] {
            assert!(LeaseRecord::decode("Redis", bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
