//! The Redis key names of the fences, under `[fences] key_prefix`, and the
//! lexicographic bounds the index is read with.
//!
//! A name is the prefix, a tag that says what it holds, and (for per-key
//! names) the fence key as it is, unescaped. No tag is a prefix of another,
//! so two names are equal only when their tags and keys are: any fence key,
//! whatever its bytes, has names of its own.

/// What a per-key name holds: the mark.
const MARK: &str = "mark:";
/// The writes of the key in flight on any replica (a sorted set).
const FLIGHT: &str = "flight:";
/// The highest token waiting to raise the key.
const WAIT: &str = "wait:";
/// The token the writes in flight carry.
const SHARED: &str = "shared:";
/// The key's lease record (fence/lease.rs), as JSON.
const LEASE: &str = "lease:";
/// Every key with a mark (a sorted set, read by lexicographic range).
const INDEX: &str = "keys";
/// The store's identity (a hash).
const IDENTITY: &str = "identity";

/// The Redis key names under one `key_prefix`.
#[derive(Debug)]
pub(super) struct Names {
    prefix: String,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        Names { prefix: prefix.to_owned() }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn of(&self, tag: &str, key: &str) -> String {
        let mut name = String::with_capacity(self.prefix.len() + tag.len() + key.len());
        name.push_str(&self.prefix);
        name.push_str(tag);
        name.push_str(key);
        name
    }

    pub fn mark(&self, key: &str) -> String {
        self.of(MARK, key)
    }

    /// What every mark's name starts with: scripts that read keys from the
    /// index build their marks' names from it.
    pub fn marks(&self) -> String {
        self.of(MARK, "")
    }

    pub fn flight(&self, key: &str) -> String {
        self.of(FLIGHT, key)
    }

    pub fn wait(&self, key: &str) -> String {
        self.of(WAIT, key)
    }

    pub fn shared(&self, key: &str) -> String {
        self.of(SHARED, key)
    }

    pub fn lease(&self, key: &str) -> String {
        self.of(LEASE, key)
    }

    pub fn index(&self) -> String {
        self.of(INDEX, "")
    }

    pub fn identity(&self) -> String {
        self.of(IDENTITY, "")
    }
}

/// `[key`: a lexicographic range bound that includes `key`.
pub(super) fn lex_inclusive(key: &str) -> Vec<u8> {
    let mut bound = Vec::with_capacity(key.len() + 1);
    bound.push(b'[');
    bound.extend_from_slice(key.as_bytes());
    bound
}

/// The upper bound of the keys starting with `prefix`: every byte of a
/// UTF-8 key is below 0xff.
pub(super) fn upper_bound(prefix: &str) -> Vec<u8> {
    if prefix.is_empty() {
        return b"+".to_vec();
    }
    let mut bound = lex_inclusive(prefix);
    bound.push(0xff);
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: [&str; 7] = [MARK, FLIGHT, WAIT, SHARED, LEASE, INDEX, IDENTITY];

    #[test]
    fn names_are_the_prefix_a_tag_and_the_key_as_it_is() {
        let names = Names::new("fg:");
        assert_eq!(names.mark("/objects/a b"), "fg:mark:/objects/a b");
        assert_eq!(names.flight("/a"), "fg:flight:/a");
        assert_eq!(names.wait("/a"), "fg:wait:/a");
        assert_eq!(names.shared("/a"), "fg:shared:/a");
        assert_eq!(names.index(), "fg:keys");
        assert_eq!(names.identity(), "fg:identity");
        assert_eq!(names.marks(), "fg:mark:");
        assert!(names.mark("ключ").ends_with("mark:ключ"));
        // The index's entries are keys; the scripts put the marks' prefix before them.
        assert_eq!(format!("{}{}", names.marks(), "/k"), names.mark("/k"));
    }

    /// Were a tag a prefix of another, a crafted key could name another
    /// key's record (`wait:` + key `x` against a tag `wait:x...`).
    #[test]
    fn no_tag_is_a_prefix_of_another_so_no_key_can_borrow_another_ones_name() {
        for a in TAGS {
            for b in TAGS {
                if a != b {
                    assert!(!b.starts_with(a), "{a:?} is a prefix of {b:?}");
                }
            }
        }
        let names = Names::new("");
        let keys = ["", "a", "mark:a", "keys", "identity", "wait:", ":"];
        let mut all: Vec<String> = Vec::new();
        for key in keys {
            all.extend([names.mark(key), names.flight(key), names.wait(key), names.shared(key)]);
        }
        all.extend([names.index(), names.identity()]);
        let count = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), count, "two names are equal");
    }

    #[test]
    fn a_prefix_range_holds_every_key_that_starts_with_it_and_nothing_after() {
        assert_eq!(lex_inclusive("/a"), b"[/a");
        assert_eq!(upper_bound(""), b"+");
        let bound = upper_bound("/b/");
        assert_eq!(bound, b"[/b/\xff");
        // Compared as Redis does: byte by byte, past the bound's `[`.
        let inside = |key: &str| key.as_bytes() <= &bound[1..];
        for key in ["/b/", "/b/z", "/b/\u{10FFFF}", "/b/\u{7ff}x"] {
            assert!(inside(key), "{key:?}");
        }
        for key in ["/b0", "/c", "/b\u{80}"] {
            assert!(!inside(key), "{key:?}");
        }
    }
}
