//! Request IDs (`X-Request-Id`): the client's kept when it is one fencegate
//! can pass on and log as it is, otherwise one made here. The same value goes
//! upstream, onto the response, into a problem document's `request_id` and
//! into the access line.
//!
//! A client's ID is kept when the request has exactly one `X-Request-Id` of
//! 1 to [`MAX_CLIENT_ID`] bytes, each visible ASCII (`!` to `~`) but the
//! quote, the backslash and the comma: no byte a log line must escape, no
//! list separator. Any other is replaced, never refused: a request ID is for
//! finding a request, not a reason to fail one.
//!
//! A made ID is 25 characters, `<12 hex digits>-<12 hex digits>`: a random
//! prefix drawn once per process, then a per-process counter. Unique within a
//! process; across processes as far as 48 random bits go. It is not a secret
//! and says nothing a client may rely on but its uniqueness.
//!
//! Made without an allocation per request: each worker thread writes its
//! next 655 IDs at once into a 16 KiB block shared by reference count, and
//! each ID is a slice of it ([`HeaderValue::from_maybe_shared`] keeps the
//! `Bytes` as it is), so a block costs two allocations per 655 IDs and an ID
//! a reference count.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;
use http::header::{Entry, HeaderMap, HeaderName, HeaderValue};

/// The request ID's header, on the request upstream and on every response.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client ID kept.
pub const MAX_CLIENT_ID: usize = 128;

/// Length of a made ID: 12 hex digits, `-`, 12 hex digits.
const MADE_LEN: usize = 25;

/// IDs written into each block at once: 16 KiB of them.
const PER_BLOCK: usize = 16 * 1024 / MADE_LEN;

/// The request's ID: its client's if that is one to keep, else a new one,
/// which then replaces whatever the client sent. Either way `headers` carry
/// it on, and one lookup finds the field and sets it.
pub fn request_id(headers: &mut HeaderMap) -> HeaderValue {
    match headers.entry(&REQUEST_ID) {
        Entry::Occupied(mut sent) => {
            let mut all = sent.iter();
            if let (Some(id), None) = (all.next(), all.next()) {
                if keeps(id.as_bytes()) {
                    return id.clone();
                }
            }
            let id = make();
            sent.insert(id.clone());
            id
        }
        Entry::Vacant(none) => none.insert(make()).clone(),
    }
}

/// Whether a client's ID is kept: see the module's documentation.
pub fn keeps(id: &[u8]) -> bool {
    (1..=MAX_CLIENT_ID).contains(&id.len())
        && id.iter().all(|&b| matches!(b, b'!' | b'#'..=b'+' | b'-'..=b'[' | b']'..=b'~'))
}

/// A new ID, cut from this thread's block.
pub fn make() -> HeaderValue {
    thread_local! {
        static BLOCK: RefCell<(Bytes, usize)> = const { RefCell::new((Bytes::new(), 0)) };
    }
    BLOCK.with_borrow_mut(|(block, at)| {
        if *at == block.len() {
            *block = next_block();
            *at = 0;
        }
        let id = block.slice(*at..*at + MADE_LEN);
        *at += MADE_LEN;
        HeaderValue::from_maybe_shared(id).expect("hex digits and a dash are a header value")
    })
}

/// The next [`PER_BLOCK`] IDs of the process, one after another.
fn next_block() -> Bytes {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let first = COUNTER.fetch_add(PER_BLOCK as u64, Ordering::Relaxed);
    let mut block = Vec::with_capacity(PER_BLOCK * MADE_LEN);
    let mut id = [0u8; MADE_LEN];
    id[..12].copy_from_slice(prefix());
    id[12] = b'-';
    for n in first..first + PER_BLOCK as u64 {
        hex12(n, &mut id[13..]);
        block.extend_from_slice(&id);
    }
    Bytes::from(block)
}

/// The process's prefix: 48 random bits in hex.
fn prefix() -> &'static [u8; 12] {
    static PREFIX: OnceLock<[u8; 12]> = OnceLock::new();
    PREFIX.get_or_init(|| {
        // Without the OS's randomness (never seen), the time and the pid
        // still set processes apart.
        let random = getrandom::u64().unwrap_or_else(|_| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(40)
        });
        let mut text = [0u8; 12];
        hex12(random, &mut text);
        text
    })
}

/// The low 48 bits of `n` as 12 lowercase hex digits.
fn hex12(n: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, digit) in out[..12].iter_mut().enumerate() {
        *digit = DIGITS[(n >> (44 - 4 * i) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn with(values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(&REQUEST_ID, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_clients_id_is_kept_within_the_bound() {
        for id in
            [&b"abc"[..], b"0f9b7c1e-2d4a-4c1b-9f00-1234567890ab", b"Root=1-5759e988;Parent=53995c3f", &[b'a'; 128]]
        {
            let mut headers = with(&[id]);
            let kept = request_id(&mut headers);
            assert_eq!(kept.as_bytes(), id);
            assert_eq!(headers.get_all(&REQUEST_ID).iter().collect::<Vec<_>>(), [&kept], "{id:?}");
        }
    }

    #[test]
    fn anything_else_is_replaced() {
        let long = [b'a'; 129];
        let cases: [&[&[u8]]; 8] =
            [&[], &[b""], &[&long], &[b"a b"], &[b"a\tb"], &[b"caf\xc3\xa9"], &[b"a\"b"], &[b"one", b"two"]];
        for values in cases {
            let mut headers = with(values);
            let id = request_id(&mut headers);
            assert_eq!(id.len(), MADE_LEN, "{values:?}");
            // The made one alone goes on, whatever the client sent.
            assert_eq!(headers.get_all(&REQUEST_ID).iter().collect::<Vec<_>>(), [&id], "{values:?}");
        }
        for b in [b',', b'\\', b'"', 0x7f] {
            assert!(!keeps(&[b'a', b]), "{b:#x}");
        }
    }

    #[test]
    fn made_ids_have_the_documented_form_and_do_not_repeat() {
        let ids: Vec<HeaderValue> = (0..3 * PER_BLOCK + 1).map(|_| make()).collect();
        let distinct: HashSet<&[u8]> = ids.iter().map(HeaderValue::as_bytes).collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            let text = id.to_str().unwrap();
            let (prefix, count) = text.split_once('-').unwrap();
            assert_eq!((prefix.len(), count.len()), (12, 12), "{text}");
            assert!(prefix.bytes().chain(count.bytes()).all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(keeps(id.as_bytes()), "a made ID is one fencegate keeps when it comes back");
        }
    }
}
