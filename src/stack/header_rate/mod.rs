//! Per client connection, how many bytes of request heads it may have
//! fencegate send upstream per second (429 `header-rate`).
//!
//! An answer to an HTTP/2 amplification: HPACK lets a few bytes on the wire
//! name a large header field again and again, so a connection sending a few
//! MiB can make fencegate write GiB to the upstream. (header_count/ bounds
//! the fields of one head.) The rate is a token bucket per connection
//! holding at most one second of bytes, checked after routing, so the
//! refusal is counted under its route, and before the head checks, so a
//! refused request never reads or raises a mark and nothing of it is
//! forwarded.
//!
//! A new connection's bucket starts with one head's worth (`max_header_bytes`,
//! so its first request always fits), not with the second of burst: the burst
//! accrues at the rate while the connection lives. A client that reconnects
//! whenever it is refused gets that one head per handshake, plus the rate
//! for as long as each connection lasts, never a fresh second of burst.

mod bucket;
mod service;

pub(crate) use service::HeaderRate;
