//! How many header fields one request head may carry: more is refused (431
//! `too-many-headers`).
//!
//! An answer to an HTTP/2 amplification: HPACK lets a few bytes on the wire
//! name a large header field again and again, so a small HEADERS frame can
//! decode into a head of `max_header_bytes`. HTTP/1.1 heads are counted by
//! hyper's parser (`max_headers`); HTTP/2 heads arrive decoded, so
//! [`check`] counts them before anything else acts on the request.
//! (header_rate/ bounds the bytes of heads a connection sends upstream.)

use http::HeaderMap;

use crate::http::REQUEST_ID;
use crate::stack::error::ProxyError;

/// Refuses a head with more than `max` fields (431), `X-Request-Id` not
/// counted: the access log adds one to a head that had none, and a head of
/// `max` fields must not be refused for it.
pub(crate) fn check(headers: &HeaderMap, max: usize) -> Result<(), ProxyError> {
    let count = headers.len();
    // The lookup only past the bound: the common case never makes it.
    if count > max && !(count == max + 1 && headers.contains_key(&REQUEST_ID)) {
        return Err(ProxyError::TooManyHeaders { count, max });
    }
    Ok(())
}
