//! Canonical forms of what a request names: its path, its host, its query
//! parameters, and the fence keys typed into the admin API.
//!
//! fencegate keys a request by the resource the upstream will apply it to
//! (invariant 5: one resource, one key). Servers accept many spellings of one
//! resource (`/objects//a`, `/objects/./a`, `/objects/%61`, `A.Example.:80`),
//! so every spelling must reach one form before anything routes, keys, signs or
//! forwards the request, and what cannot be spelled unambiguously is refused.
//!
//! The rules live here and nowhere else, as pure functions (no I/O, no
//! configuration beyond their arguments) with their own fuzz target
//! (`fuzz/`, target `canonical`). Each function borrows its input when it is
//! already canonical, so a well-formed request costs one scan and no allocation.
//!
//! What stays the upstream's: aliases only it knows (symlinks, hard links,
//! case-insensitive file systems, virtual hosts it serves under several names).
//!
//! Escapes are decoded further than RFC 3986 §6.2.2.2 requires: not only
//! unreserved characters but every character a path may hold raw (sub-delims
//! `!$&'()*+,;=`, `:` and `@`), because the upstreams fencegate stands in front
//! of (nginx, Werkzeug, Python's `http.server`) decode the whole path, and read
//! `/a%2Bb` and `/a+b` as one file. Only escapes whose raw form would change
//! the path's structure or cannot stand raw stay encoded: `%2F`, `%5C`, `%25`,
//! `%3F`, `%23`, and bytes a path cannot hold.
//!
//! | file | what it owns |
//! |---|---|
//! | `path.rs` | request paths and admin keys: escapes, slashes, dot segments |
//! | `host.rs` | hosts: case, trailing dot, default port, IPv6 literals |
//! | `query.rs` | one query parameter, form-decoded, refused when repeated |
//!
//! Escapes must decode to UTF-8. A path's escapes of bytes above 0x7F stay
//! encoded, but a run of them (escaped or raw) that is not UTF-8 text
//! (`%FF`, a lone `%C3`, an overlong or a surrogate) is refused by default:
//! Werkzeug and its kin decode such bytes to U+FFFD, so `/a%FF` and `/a%FE`
//! would be two keys for one file, and a query value decoded the same way
//! would give two resources one key. [`NonUtf8::Raw`] keeps such bytes,
//! exactly, for upstreams that compare raw bytes.

mod host;
mod path;
mod query;
#[cfg(test)]
mod tests;

pub use host::{canonical_host, is_canonical_host, HostError};
pub use path::{admin_key, canonical_path, check_path_utf8, is_plain_path, EscapedSlashes, PathError, PathOptions};
pub use query::{check_query_utf8, query_param, query_param_with, QueryError};

/// What a route does with percent-escapes (and raw bytes) that do not decode
/// to UTF-8 text, in the path and in a query value its key reads (route
/// option `non_utf8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NonUtf8 {
    /// Refused (400): servers that decode text (Werkzeug, Django, Rails)
    /// replace each invalid sequence with U+FFFD, so two spellings would name
    /// one resource under two keys, or two resources under one.
    #[default]
    Reject,
    /// Kept as bytes: a path keeps its escapes as they are (`%FF` stays
    /// `%FF`), and a keyed query value has each byte that is not part of
    /// UTF-8 text, and each `%`, written as `%XX`. For upstreams that compare
    /// raw bytes and never decode to text.
    Raw,
}
