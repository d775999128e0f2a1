//! Where the etcd store keeps what, under `key_prefix` (`P`), and how a mark
//! is written:
//! - `P mark/<key>`: the mark, 20 zero-padded decimal digits (etcd compares
//!   values as bytes, so the padding makes byte order numeric order);
//! - `P flight/<len>:<key>/<replica>/<n>`: one record per write in flight,
//!   `s <token>` (shared by the writes carrying the mark), `a <token>`
//!   (holding its key alone) or `x <token>` (a replica's share that takes no
//!   more writes: a raise waits for it), under its replica's lease. The key's length
//!   ends the prefix of its records, so no key's records fall in the range
//!   of another key the first begins (`/a` and `/a/b`);
//! - `P wait/<key>`: the highest token waiting to raise the key, under a
//!   lease of the wait's own, as long as the wait;
//! - `P lease/<key>`: the key's lease record (fence/lease.rs), as JSON;
//! - `P identity`: the store's identity, `<id> <previous id or ->`;
//! - `P held`: present while writes are held after an operator's
//!   confirmation, under a lease as long as the hold;
//! - `P deletions`: put at every delete of marks: its version counts them,
//!   so replicas forget the marks they remember.

/// The etcd keys of one store.
#[derive(Debug, Clone)]
pub(super) struct Names {
    prefix: String,
    held: String,
    deletions: String,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        Names { prefix: prefix.to_owned(), held: format!("{prefix}held"), deletions: format!("{prefix}deletions") }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn mark(&self, key: &str) -> String {
        format!("{}mark/{key}", self.prefix)
    }

    /// Where the marks begin: a mark's key is this and the fence key.
    pub fn marks(&self) -> String {
        format!("{}mark/", self.prefix)
    }

    /// The range of every record of `key`'s writes in flight.
    pub fn flights(&self, key: &str) -> String {
        format!("{}flight/{}:{key}/", self.prefix, key.len())
    }

    /// Where the waits begin: a wait's key is this and the fence key.
    pub fn waits(&self) -> String {
        format!("{}wait/", self.prefix)
    }

    pub fn wait(&self, key: &str) -> String {
        format!("{}wait/{key}", self.prefix)
    }

    pub fn lease(&self, key: &str) -> String {
        format!("{}lease/{key}", self.prefix)
    }

    pub fn identity(&self) -> String {
        format!("{}identity", self.prefix)
    }

    pub fn held(&self) -> &str {
        &self.held
    }

    pub fn deletions(&self) -> &str {
        &self.deletions
    }
}

/// The etcd keys of one fence key's turn, named once per turn.
#[derive(Debug)]
pub(super) struct KeyNames {
    pub mark: String,
    pub wait: String,
    /// The range of the key's records (a prefix).
    pub flights: String,
}

impl Names {
    pub fn of(&self, key: &str) -> KeyNames {
        KeyNames { mark: self.mark(key), wait: self.wait(key), flights: self.flights(key) }
    }
}

/// `token` as a mark's value.
pub(super) fn mark_value(token: u64) -> String {
    format!("{token:020}")
}

/// The token a mark's value holds.
pub(super) fn parse_mark(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// One write in flight, as its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record {
    pub token: u64,
    /// Holds its key alone: no other write joins it.
    pub alone: bool,
    /// A replica's share that a raise stopped: it takes no more writes,
    /// and ends with the writes it has.
    pub draining: bool,
}

impl Record {
    pub fn value(self) -> String {
        let kind = match (self.alone, self.draining) {
            (true, _) => 'a',
            (false, true) => 'x',
            (false, false) => 's',
        };
        format!("{kind} {}", self.token)
    }

    pub fn parse(value: &[u8]) -> Option<Record> {
        let text = std::str::from_utf8(value).ok()?;
        let (kind, token) = text.split_once(' ')?;
        let (alone, draining) = match kind {
            "a" => (true, false),
            "s" => (false, false),
            "x" => (false, true),
            _ => return None,
        };
        Some(Record { token: token.parse().ok()?, alone, draining })
    }
}

/// The first key after every key that starts with `prefix` (etcd's range
/// end for a prefix); `\0` (every key from it on) when there is none.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_sort_as_numbers_and_read_back() {
        let values: Vec<String> = [0, 9, 10, 99, 1_000_000, u64::MAX].into_iter().map(mark_value).collect();
        let mut sorted = values.clone();
        sorted.sort();
        assert_eq!(values, sorted);
        assert!(values.iter().all(|v| v.len() == 20));
        assert_eq!(parse_mark(mark_value(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(parse_mark(b"12x"), None);
    }

    #[test]
    fn no_keys_records_fall_in_the_range_of_a_key_it_begins() {
        let names = Names::new("P/");
        let a = names.flights("/a");
        let ab = names.flights("/a/b");
        assert!(!ab.starts_with(&a), "{ab} is in the range of {a}");
        assert!(!a.starts_with(&ab));
    }

    #[test]
    fn records_read_back() {
        for record in [
            Record { token: 7, alone: true, draining: false },
            Record { token: 0, alone: false, draining: false },
            Record { token: 3, alone: false, draining: true },
        ] {
            assert_eq!(Record::parse(record.value().as_bytes()), Some(record));
        }
        assert_eq!(Record::parse(b"y 7"), None);
        assert_eq!(Record::parse(b"s"), None);
    }

    #[test]
    fn a_prefix_ends_at_the_next_key_after_it() {
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
